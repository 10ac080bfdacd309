"""`python -m condattn.train [overrides]`: one training run (see configs/train.yaml); `-m` sweeps as Hydra does.

Before Hydra runs anything, every job's overrides are composed and checked like `reproduce` checks a table's cells:
an unknown group option or key, a bad value (seed, λ, batch sizes, schedule, ...), an option its method does not use,
a run dir that holds another config. Each problem is one line on stderr, the exit status is 2, and nothing is
written (Hydra itself creates no directory; the trainer creates the run dir once the run starts).

The run name is the readable `${task.name}_${conditioning.method}_${scale.name}_s${seed}`, plus `-<8 hex>` when an
override changes what that name does not carry (engine/identity.py), so `conditioning.lam=2` and the default λ = 10
are two runs, and a sweep over an option gives one run per value.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig, open_dict, read_write

from .config import CONFIG_DIR, resolve_paths
from .utils.ranks import launcher_rank

# Hydra flags whose value is the next argument (not an override)
_FLAGS_WITH_VALUE = {"-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--experimental-rerun",
                     "-c", "--cfg", "-p", "--package", "--info", "-i"}
_INFO_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "--info", "-i", "--resolve", "-sc",
               "--shell-completion", "--experimental-rerun"}

_names: dict[frozenset, str] = {}  # each job's overrides -> its run name with the variant suffix (set by `check`)
_checked: dict[frozenset, object] = {}  # each job's overrides -> its preflight's Checked, handed to `train` (once)


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra flags with their values, overrides)."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-"):
            flags.append(a)
            nxt = argv[i + 1] if i + 1 < len(argv) else "-"
            if a in _FLAGS_WITH_VALUE and not nxt.startswith("-") and "=" not in nxt:
                flags.append(argv[i + 1])
                i += 1
        else:
            overrides.append(a)
        i += 1
    return flags, overrides


def _jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override list of every job: one, or each combination of a `-m` sweep (Hydra's basic sweeper's order)."""
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def check(overrides: list[str], world: int | None = None) -> list[str]:
    """Every problem of one job's overrides, one line each (empty: it may run); records the job's run name."""
    from .config import ConfigError, compose, compose_cell
    from .engine.identity import name_variant, options_not_applying
    from .engine.preflight import preflight_checked

    try:
        cfg = compose_cell(overrides)
    except ConfigError as e:
        return [str(e)]
    if variant := name_variant(cfg, overrides, compose):
        cfg.run.name = f"{cfg.run.name}-{variant}"
    _names[frozenset(overrides)] = str(cfg.run.name)
    world = world or int(os.environ.get("WORLD_SIZE", "1") or 1)
    out = options_not_applying(cfg, overrides)
    checked = preflight_checked(cfg, world, check_data=False, check_run_dir=True)
    _checked[frozenset(overrides)] = checked
    out += checked.messages
    return list(dict.fromkeys(out))


def cli(argv: list[str]) -> int | None:
    """Check every job, then hand over to Hydra (None) or refuse (2)."""
    flags, overrides = _split_argv(argv)
    if set(flags) & _INFO_FLAGS or any(f.startswith("hydra") for f in overrides):
        return None  # Hydra's own help/inspection: nothing is trained
    try:
        jobs = _jobs(overrides, multirun=bool({"-m", "--multirun"} & set(flags)))
    except Exception as e:
        problems = [f"overrides {' '.join(overrides)}: {str(e).strip().splitlines()[0]}"]
    else:
        problems = list(dict.fromkeys(p for job in jobs for p in check(job)))
    if problems:
        if launcher_rank() == 0:
            for p in problems:
                print(f"[condattn] {p}", file=sys.stderr)
        return 2
    return None


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from .engine.checkpoint import CheckpointUnreadable
    from .engine.preflight import PreflightError
    from .engine.trainer import TrainingDiverged, TrainingInterrupted, train

    name = _names.get(frozenset(HydraConfig.get().overrides.task))
    with read_write(cfg), open_dict(cfg):
        resolve_paths(cfg)  # relative paths.* from the project root, as `cli`'s checks composed them (config.py)
        if name is not None:
            cfg.run.name = name
    try:
        s = train(cfg, _checked.pop(frozenset(HydraConfig.get().overrides.task), None))  # checked by `cli`
    except TrainingInterrupted as e:
        print(f"[condattn] interrupted: {e}", file=sys.stderr)
        sys.exit(3)
    except PreflightError as e:
        for p in e.problems:
            print(f"[condattn] {p}", file=sys.stderr)
        sys.exit(2)
    except (TrainingDiverged, FileNotFoundError, CheckpointUnreadable) as e:  # diverged, missing data: no traceback
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
    if (code := cli(sys.argv[1:])) is not None:
        sys.exit(code)
    main()
