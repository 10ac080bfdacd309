"""Provenance noise: the commit a run records, and the permissions of the files a run writes."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from condattn.engine import provenance
from condattn.runs import RunRecord
from condattn.utils.files import write_bytes_atomic, write_json_atomic


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                   capture_output=True)


@pytest.mark.slow
def test_rebuilt_tables_do_not_mark_runs_dirty(tmp_path, monkeypatch):
    """Editing a tracked file under results/ (what `make reproduce-*` does) leaves the commit clean; editing code
    marks it +dirty."""
    repo = tmp_path / "repo"
    (repo / "results" / "table4").mkdir(parents=True)
    (repo / "condattn").mkdir()
    (repo / "results" / "table4" / "table4_smoke.md").write_text("| a |\n")
    (repo / "condattn" / "x.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "init")
    monkeypatch.setattr(provenance, "REPO", repo)
    clean = provenance.git_commit()
    assert len(clean) == 10 and not clean.endswith("+dirty")
    (repo / "results" / "table4" / "table4_smoke.md").write_text("| b |\n")
    assert provenance.git_commit() == clean
    (repo / "condattn" / "x.py").write_text("x = 2\n")
    assert provenance.git_commit() == clean + "+dirty"


def test_run_files_are_written_with_the_usual_permissions(tmp_path):
    """Atomic writes give what a plain write gives: 0o666 less the umask for a new file (0644 under umask 022),
    an existing file's own permissions otherwise; never mkstemp's 0600."""
    old = os.umask(0o022)
    try:
        RunRecord(tmp_path / "run").write_summary({"status": "finished", "metrics": {"val_acc": 0.5}})
        assert stat.S_IMODE((tmp_path / "run" / "summary.json").stat().st_mode) == 0o644
        target = tmp_path / "kept.json"
        write_json_atomic(target, {"a": 1})
        os.chmod(target, 0o640)
        write_json_atomic(target, {"a": 2})
        assert stat.S_IMODE(target.stat().st_mode) == 0o640
        write_bytes_atomic(tmp_path / "b.bin", b"x")
        assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o644
        assert not list(tmp_path.glob(".*.tmp"))
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o077, 0o002])
def test_atomic_writes_follow_the_umask(tmp_path, monkeypatch, mask):
    from condattn.utils import files

    monkeypatch.setattr(files, "_umask", lambda: mask)
    write_bytes_atomic(tmp_path / "f", b"x")
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o666 & ~mask
