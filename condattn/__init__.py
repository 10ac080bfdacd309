"""condattn: reproduce conditioned embedded tokens (CET) and spectral conditioning of attention (SCA).

`import condattn` loads only the method library (condattn.conditioning, condattn.diagnostics): no Hydra, no
harness. The harness's entry points import condattn.config themselves (which registers its config resolvers).
"""

from .conditioning import (
    PatchReport,
    after_optimizer_step,
    apply_conditioning,
    conditioning_report,
    remove_conditioning,
)

__version__ = "0.1.0"
__all__ = ["PatchReport", "after_optimizer_step", "apply_conditioning", "conditioning_report", "remove_conditioning",
           "__version__"]
