"""`python -m condattn.reporting experiments/tableN.yaml --scale S [--seeds ...] [overrides]`: rebuild any table from
its runs with the experiment's own renderer (`renderer:`, else the generic one) — the one CLI of every renderer."""

import sys

from .tables import renderer_cli

if __name__ == "__main__":
    sys.exit(renderer_cli(None, "python -m condattn.reporting", __doc__))
