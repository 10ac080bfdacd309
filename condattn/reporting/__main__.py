"""`python -m condattn.reporting experiments/tableN.yaml --scale S [...]`: an alias of `python -m condattn.reproduce
experiments/tableN.yaml --scale S --report-only [...]`, which plans the table once and writes it with the experiment's
renderer (`renderer:`, else the generic one)."""

import sys

from ..reproduce import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--report-only"]))
