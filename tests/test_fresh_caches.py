"""The suite runs with caches of its own, as on a new machine (tests/conftest.py `_fresh_caches`): a session that
starts with empty user caches passes, the plotting path included, and the user's caches are never read or written."""

import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_session_caches_are_its_own():
    root = os.environ["CONDATTN_TEST_CACHES"]
    for var in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        assert os.environ[var].startswith(root), var
    assert matplotlib.get_cachedir().startswith(root)
    assert list(Path(matplotlib.get_cachedir()).glob("fontlist-*.json")), "the font cache was not warmed"


@pytest.mark.slow
def test_a_unit_session_with_empty_user_caches_draws_a_figure(tmp_path):
    """A new machine: empty matplotlib, XDG and inductor caches and no session caches to inherit. matplotlib's first
    import builds its font cache in a subprocess, which the unit tier refuses unless conftest warmed it first."""
    env = {k: v for k, v in os.environ.items() if k != "CONDATTN_TEST_CACHES"}
    for var in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        env[var] = str(tmp_path / var.lower())
    test = "tests/test_compare.py::test_compare_cli_table_and_figure"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "unit", "-p", "no:cacheprovider",
                          test], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
    assert not (tmp_path / "mplconfigdir").exists(), "the session wrote into the user's matplotlib folder"
