"""Run logging: always `metrics.jsonl` in the run dir (rank 0), and wandb unless `logger=none`."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from ..utils.io import read_jsonl


class RunLogger:
    def __init__(self, run_dir: Path, cfg: Any, is_main: bool, resumed_step: int | None, config: dict):
        self.path = run_dir / "metrics.jsonl"
        self.is_main = is_main
        self.wandb = None
        if not is_main:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        # on resume, drop rows logged after the checkpoint: they will be logged again
        rows = read_jsonl(self.path) if resumed_step is not None else []
        with open(self.path, "w") as f:
            for r in rows:
                if r.get("step", 0) <= resumed_step:
                    f.write(json.dumps(r) + "\n")
        if cfg.logger.name == "wandb":
            self.wandb = self._init_wandb(run_dir, cfg, config)

    @staticmethod
    def _init_wandb(run_dir: Path, cfg: Any, config: dict):
        import wandb

        id_file = run_dir / "wandb_id.txt"  # same wandb run across resumes and requeues
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id)
        return wandb.init(
            project=cfg.logger.project,
            entity=cfg.logger.entity,
            name=cfg.run.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", cfg.logger.mode),
            config=config,
            group=cfg.run.table,
            tags=[str(cfg.conditioning.method), str(cfg.scale.name)],
        )

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        if not self.is_main:
            return
        row = {"step": step, "split": split, **{k: _plain(v) for k, v in values.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:
            self.wandb.log({f"{split}/{k}": v for k, v in row.items() if k not in ("step", "split")}, step=step)

    def finish(self, summary: dict | None = None) -> None:
        if self.wandb is not None:
            if summary:
                for k, v in summary.get("metrics", {}).items():
                    self.wandb.summary[k] = v
                # what `compare wandb:...` needs besides the metrics
                self.wandb.summary["condattn/steps"] = summary.get("steps")
                self.wandb.summary["condattn/wall_time_s"] = summary.get("wall_time_s")
            self.wandb.finish()


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v
