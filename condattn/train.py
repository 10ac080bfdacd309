"""`python -m condattn.train [overrides]`: one training run (see configs/train.yaml)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from .config import CONFIG_DIR


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from .engine.trainer import TrainingInterrupted, train

    try:
        s = train(cfg)
    except TrainingInterrupted as e:
        print(f"[condattn] interrupted: {e}", file=sys.stderr)
        sys.exit(3)
    m = s["metrics"]
    print(
        f"[condattn] {s['run_name']}: val_acc={m['val_acc']:.4f} test_acc={m.get('test_acc', float('nan')):.4f} "
        f"steps={s['steps']} wall={s['wall_time_s']:.0f}s -> {s['run_dir']}/summary.json"
    )


if __name__ == "__main__":
    main()
