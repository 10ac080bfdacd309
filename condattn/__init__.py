"""condattn: reproduce conditioned embedded tokens (CET) and spectral conditioning of attention (SCA)."""

from . import config as _config  # noqa: F401  (registers the config resolvers, e.g. epoch_steps)
from .conditioning import PatchReport, apply_conditioning, conditioning_report, remove_conditioning

__version__ = "0.1.0"
__all__ = ["PatchReport", "apply_conditioning", "conditioning_report", "remove_conditioning", "__version__"]
