"""Test tiers (docs/tests.md): `slow` (trains or starts processes), `gpu` (needs CUDA) and `unit` (everything else;
added here at collection, so `pytest -m unit` is `make test-unit`). A unit test that trains or starts a process fails
with "mark it @pytest.mark.slow"; every test has a timeout (pyproject's for slow and gpu, UNIT_TIMEOUT_S for unit).
Each session starts with empty caches of its own (see `_fresh_caches`), as on a new machine. Helpers live in
tests/helpers.py."""

import importlib.util
import logging
import multiprocessing.process
import os
import shutil
import subprocess
import tempfile
import traceback

import pytest

pytest_plugins = ("pytester",)  # tests/test_tiers.py runs the tier rules in a session of its own

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

CACHES_ENV = "CONDATTN_TEST_CACHES"
CACHE_VARS = {"MPLCONFIGDIR": "matplotlib", "XDG_CACHE_HOME": "xdg", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def _fresh_caches() -> str | None:
    """Point matplotlib's, the XDG and inductor's caches into one folder, so a run sees what a new machine sees and the
    user's caches neither help nor break it. A new temporary folder per session (returned, to be removed at the end),
    unless $CONDATTN_TEST_CACHES names one: set by the user to keep warm caches between runs, or by this session's
    controller for its xdist workers and subprocesses (they inherit the environment)."""
    root, created = os.environ.get(CACHES_ENV), None
    if not root:
        root = created = tempfile.mkdtemp(prefix="condattn-test-caches-")
        os.environ[CACHES_ENV] = root
    for var, sub in CACHE_VARS.items():
        os.environ[var] = os.path.join(root, sub)
        os.makedirs(os.environ[var], exist_ok=True)
    return created


def _warm_caches() -> None:
    """What builds a cache in a subprocess on its first use, built now, before the unit guard would refuse it:
    matplotlib's font cache (its first import runs fc-list). A compat environment (scripts/compat.py) has no
    matplotlib, and nothing there plots."""
    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.font_manager  # noqa: F401


_CREATED_CACHES = _fresh_caches()
_warm_caches()


def pytest_unconfigure(config):
    if _CREATED_CACHES:
        shutil.rmtree(_CREATED_CACHES, ignore_errors=True)

UNIT_TIMEOUT_S = 60  # a hang fails; a unit test should take well under UNIT_BUDGET_S
UNIT_BUDGET_S = 2.0  # unit tests slower than this are listed at the end of the run
SLOW_BUDGET_S = 10.0  # and slow-tier tests slower than this, so that the next costly test is seen when it is added
# Parametrised cases of these models are slow-tier: transformers' DETR with its timm ResNet backbone takes seconds to
# import and tenths of a second a case (41 cases were 11 % of the unit tier's time), every other model of the unit
# tier milliseconds. They still run in `make test`.
SLOW_CASES = ("detr",)


class UnitTierViolation(RuntimeError):
    """Not an OSError, so code that tolerates a failed subprocess (provenance's git call) does not swallow it."""


def pytest_collection_modifyitems(config, items):
    import torch  # here, not at the top: xdist's controller neither collects nor runs tests (2 s of start-up saved)

    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and not item.get_closest_marker("unit") and \
                any(isinstance(v, str) and v in SLOW_CASES for v in callspec.params.values()):
            item.add_marker(pytest.mark.slow)
        tiers = [m for m in ("slow", "gpu") if item.get_closest_marker(m)]
        if item.get_closest_marker("unit") and tiers:
            raise pytest.UsageError(f"{item.nodeid}: marked unit and {tiers[0]}; a test is in one tier, drop one")
        if skip_gpu and "gpu" in tiers:
            item.add_marker(skip_gpu)
        if not tiers:
            item.add_marker(pytest.mark.unit)
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise UnitTierViolation(f"{what} in a unit test: mark it @pytest.mark.slow (the unit tier neither trains nor "
                                "starts processes)")
    return refuse


def guard_unit_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make training (the engine's step loop) and every way of starting a process raise UnitTierViolation."""
    try:
        from condattn.engine.loop import StepLoop
    except ModuleNotFoundError as e:  # a compat environment without the harness: nothing there trains
        if not _absent(e):
            raise
    else:
        monkeypatch.setattr(StepLoop, "train", _refuse("training (StepLoop.train)"))
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("a multiprocessing process"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve", "execv", "execve"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))


LAYOUTS = os.path.join("condattn", "conditioning", "layouts", "")


def _absent(e: ModuleNotFoundError) -> str:
    """Under CONDATTN_COMPAT=1 (scripts/compat.py: environments with torch, timm and transformers only), the package
    `e` misses when this environment does not install it; '' otherwise (a module an installed package lacks is a
    failure: the library must handle that release), and always in the dev venv. A layout finder's import is never a
    missing package: it imports a library only for a model of that library (sites.of_library), so it fails."""
    top = (e.name or "").partition(".")[0]
    compat = os.environ.get("CONDATTN_COMPAT") == "1"
    if any(LAYOUTS in frame.filename for frame in traceback.extract_tb(e.__traceback__)):
        return ""
    return top if compat and top and top != "condattn" and importlib.util.find_spec(top) is None else ""


def _skip_if_absent(e: ModuleNotFoundError) -> None:
    """A test that needs a package the compat environment does not install is skipped, naming it."""
    if top := _absent(e):
        pytest.skip(f"needs {top}, which this compat environment does not have")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    try:
        return (yield)
    except ModuleNotFoundError as e:
        _skip_if_absent(e)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except ModuleNotFoundError as e:
        _skip_if_absent(e)
        raise


_GUARD = pytest.StashKey[pytest.MonkeyPatch]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A unit test is guarded from its setup to its teardown, so a fixture that trains is caught too."""
    with pytest.MonkeyPatch.context() as mp:
        if item.get_closest_marker("unit"):
            guard_unit_tier(mp)
        item.stash[_GUARD] = mp
        return (yield)


@pytest.fixture
def unit_guard(request) -> pytest.MonkeyPatch:
    """This test's guard: `unit_guard.undo()` lifts it (slow and gpu tests have none to lift)."""
    return request.node.stash[_GUARD]


_over_budget: dict[str, list[tuple[float, str]]] = {"unit": [], "slow": []}


def pytest_runtest_logreport(report):
    """Setup, call and teardown together: a test's costly fixture counts as the test's."""
    if report.when != "teardown":
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
        return
    total = _durations.pop(report.nodeid, 0.0) + report.duration
    for tier, budget in (("unit", UNIT_BUDGET_S), ("slow", SLOW_BUDGET_S)):
        if tier in report.keywords and total > budget:
            _over_budget[tier].append((total, report.nodeid))


_durations: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter):
    for tier, budget, advice in (("unit", UNIT_BUDGET_S, "speed them up or mark them slow"),
                                 ("slow", SLOW_BUDGET_S, "share their fixtures, or run in-process")):
        if _over_budget[tier]:
            terminalreporter.section(f"{tier} tests over {budget:g} s, setup included ({advice})")
            for d, nodeid in sorted(_over_budget[tier], reverse=True):
                terminalreporter.write_line(f"{d:6.1f} s  {nodeid}")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread is faster, and far faster on a loaded machine (OpenMP sync dominates). A test
    module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def transformers_log(caplog, monkeypatch):
    """caplog that sees transformers' own log records (its root logger stops propagation once configured)."""
    from transformers.utils import logging as tf_logging

    tf_logging.get_logger("transformers")  # (configured now: its root stops propagation, which caplog needs)
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    caplog.set_level(logging.WARNING)
    return caplog
