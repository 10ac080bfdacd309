"""Stop requests as a flag checked at safe points (a step boundary, between two cells of a table).

SIGTERM (scancel, a node shutting down), SIGUSR1/SIGUSR2 (SLURM's `--signal` before the time limit or on
preemption; submitit asks for USR2) and the first Ctrl-C set the flag; a second Ctrl-C raises
KeyboardInterrupt at once. `StopFlag` contexts nest: `reproduce` holds one around all cells and the
trainer one around its loop, and both see the same request, so a signal that arrives between two cells (or
while a cell is still building its model) stops the table cleanly instead of killing it half-way.
"""

from __future__ import annotations

import signal
from typing import Any

STOP_SIGNALS = tuple(
    s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None), signal.SIGINT)
    if s is not None
)


class _Shared:
    signum: int | None = None
    depth = 0
    old: dict[int, Any] = {}


def _handle(signum, frame):
    if _Shared.signum is not None and signum == signal.SIGINT:
        raise KeyboardInterrupt  # second Ctrl-C: stop now
    _Shared.signum = signum


class StopFlag:
    """`with StopFlag() as stop: ... if stop.requested: ...`; the outermost context installs the handlers
    and restores the previous ones (e.g. submitit's) on exit."""

    def __enter__(self) -> StopFlag:
        if _Shared.depth == 0:
            _Shared.signum = None
            _Shared.old = {s: signal.signal(s, _handle) for s in STOP_SIGNALS}
        _Shared.depth += 1
        return self

    def __exit__(self, *exc) -> None:
        _Shared.depth -= 1
        if _Shared.depth == 0:
            for s, h in _Shared.old.items():
                signal.signal(s, h)
            _Shared.old = {}

    @property
    def signum(self) -> int | None:
        return _Shared.signum

    @property
    def requested(self) -> bool:
        return _Shared.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(_Shared.signum).name if _Shared.signum is not None else "none"
