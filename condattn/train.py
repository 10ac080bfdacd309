"""`python -m condattn.train [overrides]`: one training run (see configs/train.yaml).

Under `accelerate launch -m condattn.train ...` every process runs this main; only rank 0 lets Hydra write
`<run dir>/.hydra/` and its log file, so the ranks never race on the same files.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from .config import CONFIG_DIR


def _launcher_rank() -> int:
    for var in ("RANK", "SLURM_PROCID"):  # set by accelerate/torchrun, or by srun for one task per GPU
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from .engine.preflight import PreflightError
    from .engine.trainer import TrainingDiverged, TrainingInterrupted, train

    try:
        s = train(cfg)
    except TrainingInterrupted as e:
        print(f"[condattn] interrupted: {e}", file=sys.stderr)
        sys.exit(3)
    except (PreflightError, TrainingDiverged, FileNotFoundError) as e:  # bad input or a diverged run: no traceback
        print(f"[condattn] {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
    m = s["metrics"]
    sel = next((k for k in m if k.startswith("val_")), "val_acc")  # the task's selection metric (val_loss for lm/mlm)
    print(
        f"[condattn] {s['run_name']}: {sel}={m.get(sel, float('nan')):.4f} "
        f"test_acc={m.get('test_acc', float('nan')):.4f} "
        f"steps={s['steps']} wall={s['wall_time_s']:.0f}s -> {s['run_dir']}/summary.json"
    )


if __name__ == "__main__":
    if _launcher_rank() > 0:
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    main()
