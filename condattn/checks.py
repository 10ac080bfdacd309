"""Value checks that every entry point makes before any compute, one line each naming the value and the fix.

`value_problems` (a composed config's numbers: lr, weight decay, threads, seed) runs in the preflight of `train` and of
every cell of `reproduce`; `threads_problem` also in `diagnose`. `early_problems` runs in `reproduce` and
`reproduce-all` before the plan: the same numbers where the command's overrides give them, the `resume` mode, the runs
and results folders (which the plan and the kept records' restore would otherwise touch first), and the overrides a
table cannot take (`table_override_problems`: the scale, the method, a `+key` nothing reads, a precision this machine
does not run); `seed_problems` checks the seeds a command reports. `writable_problem` also writes a probe file:
`os.access` says yes to root on /proc and some read-only mounts.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

RESUME_MODES = ("auto", "never")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def threads_problem(impl: Any) -> str | None:
    """impl.threads: null (torch's default) or a positive integer; 0 or -1 is refused, never read as "unset"."""
    return _threads(impl.get("threads") if impl is not None else None)


def _threads(v: Any) -> str | None:
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return None
    return (f"impl.threads={v!r} must be a positive integer (torch's intra-op threads, e.g. impl.threads=1), or null "
            "for torch's default")


def _lr(v: Any) -> str | None:
    if (x := _number(v)) is None or not math.isfinite(x) or x <= 0:
        return f"optim.lr={v!r} must be a positive number (e.g. optim.lr=1e-4)"
    return None


def _weight_decay(v: Any) -> str | None:
    if (x := _number(v)) is None or not math.isfinite(x) or x < 0:
        return f"optim.weight_decay={v!r} must be a number ≥ 0 (0: no weight decay)"
    return None


SEED_LIMIT = 2**32  # numpy's seeds are 0 ≤ s < 2**32 (torch's too, through its generator's uint64 from numpy's range)


def _seed(v: Any) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < SEED_LIMIT:
        return None
    return f"seed={v!r} must be an integer 0 ≤ seed < 2**32 ({SEED_LIMIT:,}), e.g. seed=0"


VALUE_CHECKS = {"optim.lr": _lr, "optim.weight_decay": _weight_decay, "impl.threads": _threads, "seed": _seed}


def seed_problems(seeds: list[int]) -> list[str]:
    """The reported seeds of a command (--seeds, SEEDS=): each 0 ≤ s < 2**32, none twice."""
    out = [f"--seeds: seed {s} is out of range: each seed is an integer 0 ≤ s < 2**32 ({SEED_LIMIT:,})"
           for s in seeds if _seed(s)]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        out.append(f"--seeds {' '.join(map(str, seeds))}: seed {', '.join(map(str, twice))} is given more than once; "
                   "give each seed once (each is one run per cell)")
    return out


def value_problems(cfg: Any) -> list[str]:
    """optim.lr > 0 and finite, optim.weight_decay ≥ 0 and finite, impl.threads (threads_problem), 0 ≤ seed < 2**32."""
    return [why for key, check in VALUE_CHECKS.items() if (why := check(OmegaConf.select(cfg, key)))]


def writable_problem(path: str | Path) -> str | None:
    """Why files cannot be written under `path` (None: they can): the folder, or the nearest folder above it that
    exists (it would be created there), must be a directory that takes a new file."""
    p = Path(path).expanduser().absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    held = "" if probe == p else f" (it would hold {p})"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable{held}"
    try:  # os.access says yes to root on /proc and on some read-only mounts: write a file to be sure
        fd, name = tempfile.mkstemp(prefix=".condattn-write-probe-", dir=probe)
    except OSError as e:
        return f"{probe} is not writable ({e.strerror or e}){held}"
    os.close(fd)
    os.unlink(name)
    return None


def _last_override(overrides: list[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+~") == key]
    return values[-1] if values else None


def early_problems(overrides: list[str]) -> list[str]:
    """`reproduce`'s checks before it plans a cell: lr, weight decay, threads and the resume mode where overrides give
    them, and the runs and results folders (paths.runs / paths.results overrides, else $CONDATTN_RUNS /
    $CONDATTN_RESULTS, else the project's)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from .config import PROJECT_ROOT

    out = []
    for key, check in VALUE_CHECKS.items():  # as Hydra reads the value (1e-4 a float, null None, 0 an int)
        if (raw := _last_override(overrides, key)) is not None:
            try:
                value = OverridesParser.create().parse_override(f"{key}={raw}").value()
            except Exception:  # noqa: BLE001 - Hydra's own message comes when the cell composes
                continue
            if why := check(value):
                out.append(why)
    resume = _last_override(overrides, "resume")
    if resume is not None and resume not in RESUME_MODES:
        out.append(f"resume={resume!r} must be auto (continue from the run dir's last checkpoint; a finished run is "
                   "kept) or never (start the run over)")
    for key, env, default, what in (("paths.runs", "CONDATTN_RUNS", "runs", "the runs"),
                                    ("paths.results", "CONDATTN_RESULTS", "results", "the tables")):
        value = _last_override(overrides, key) or os.environ.get(env) or default
        path = Path(value) if Path(value).is_absolute() else PROJECT_ROOT / value
        if why := writable_problem(path):
            out.append(f"{key}={value}: {why}, so {what} cannot be written there; make it writable, or point {key}= "
                       f"(or ${env}) at a writable folder")
    return out


def table_override_problems(overrides: list[str], experiment: str, methods: list[str], launcher: str = "local",
                            cuda: bool | None = None) -> list[str]:
    """The overrides a table's command cannot take, one line each: `scale=` (the command's --scale / SCALE= says it,
    and the run names follow it), a method group (`conditioning=`: the table's methods are its columns), a `+key` that
    adds a key nothing reads (config.ADDABLE_KEYS are the ones the code reads), and `impl.precision` other than "no"
    where the cells run on this machine and it has no CUDA device (a CPU run uses impl.cpu_precision: the table would
    name a precision that did not run). `cuda`: whether this machine has CUDA (None: ask torch)."""
    from .config import ADDABLE_KEYS

    out = []
    for o in overrides:
        key = o.split("=", 1)[0]
        bare = key.lstrip("+~")
        if bare == "scale" or bare.startswith("scale."):
            out.append(f"override {o!r}: the scale is the command's, SCALE= (--scale), which also names the runs; give "
                       "SCALE= instead of scale= in ARGS")
        elif bare in ("conditioning", "conditioning.method"):
            out.append(f"override {o!r} would train every method column of the table ({', '.join(methods)}) as one "
                       f"method: a table's methods are the `methods:` of {experiment}; train some rows with ROWS=, add "
                       "the method there, or train one run with python -m condattn.train")
        elif key.startswith("+") and not key.startswith("++") and bare not in ADDABLE_KEYS:
            out.append(f"override {o!r} adds a key that no config declares and no code reads (it would only rename "
                       f"every cell and train it again); '+' may add: {', '.join(sorted(ADDABLE_KEYS))}; a key the "
                       "config has is set without '+'")
    precision = _last_override(overrides, "impl.precision")
    if precision not in (None, "no") and launcher == "local" and not (_has_cuda() if cuda is None else cuda):
        out.append(f"impl.precision={precision} is the precision of a CUDA run, and this machine has no CUDA device: "
                   "its cells would train in impl.cpu_precision (fp32 unless set) under a table made with "
                   f"impl.precision={precision}; give impl.cpu_precision={precision} to train in it on the CPU, or "
                   "drop the override")
    return out


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
