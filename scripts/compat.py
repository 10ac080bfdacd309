"""The compatibility matrix (`make test-compat`): the method library's contract tests on each release it claims.

Each environment is a venv under .compat/ (gitignored; reused while its releases are unchanged) holding only
torch, timm, transformers, pytest and this clone (editable, with the `timm` and `transformers` extras: no harness
package); one holds torch alone (`pip install condattn`). In each, the tests marked `compat` (pytest's `-m compat`, in
the files that carry the marker) run against this clone's code. Each environment's last result is kept in
results/compat/runs.json (when, at which commit, releases, pass / fail / skip counts, time); results/compat/matrix.md
is rendered from it after every run.

    python scripts/compat.py                 the claimed matrix: every environment below
    python scripts/compat.py --only t2130 t2130-tf524   the named environments only (their rows are replaced)

A release is claimed (pyproject.toml's ranges, the README) only when every environment holding it passed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".compat"
OUT = ROOT / "results" / "compat" / "matrix.md"
RUNS = ROOT / "results" / "compat" / "runs.json"  # each environment's last run

TORCH = ("2.13.0", "2.14.1")  # the oldest claimed and the harness's pin
TIMM = ("1.0.15", "1.0.31")  # 1.0.15: the last release before timm moved `Attention` to timm.layers (1.0.16)
TRANSFORMERS = ("4.57.6", "5.24.0")  # the last 4.x and the harness's pin (attention refactored between them)
# timm needs torchvision, and a torchvision built for the same torch: PyPI's is the CUDA build, whose ops do not load
# beside a CPU torch. torch 2.13.0 is here as a CPU build only (its CPU torchvision is on the PyTorch index, which this
# machine does not reach), so timm is tested on torch 2.14.1 alone; torch 2.13.0 with transformers and own models.
TORCHVISION = {"2.14.1": "0.29.1"}

TOOLS = ("pytest>=8", "pytest-timeout>=2.3")


def env_name(torch: str, timm: str | None, tf: str | None) -> str:
    return f"t{torch.replace('.', '')[:4]}" + (f"-timm{timm.replace('.', '')}" if timm else "") + \
        (f"-tf{tf.replace('.', '')[:3]}" if tf else "")


def claimed() -> dict[str, tuple[str, str | None, str | None]]:
    """The claimed matrix: torch alone (the core install), then every combination of the releases above (timm only on
    a torch TORCHVISION names; without timm, torch with transformers)."""
    alone = (TORCH[0], None, None)
    return {env_name(*alone): alone} | {env_name(*c): c for c in itertools.product(TORCH, (None, *TIMM), TRANSFORMERS)
                                        if (c[1] is not None) == (c[0] in TORCHVISION)}


def run(cmd: list[str], log: Path, **kw) -> int:
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw).returncode


def build(name: str, releases: tuple[str, str | None, str | None], log: Path) -> Path:
    """The venv of `name` (.compat/<name>), built once: reused while its stamp names the same releases."""
    torch, timm, tf = releases
    venv = CACHE / name
    py = venv / "bin" / "python"
    stamp = venv / "condattn-compat.txt"
    pins = [f"torch=={torch}"] + ([f"transformers=={tf}"] if tf else [])
    if timm:
        pins += [f"timm=={timm}", f"torchvision=={TORCHVISION[torch]}"]
    want = " ".join(pins) + "\n"
    if stamp.exists() and stamp.read_text() == want and py.exists():
        return py
    if run([sys.executable, "-m", "venv", "--clear", str(venv)], log):
        raise SystemExit(f"compat: could not create the venv {venv} (log: {log})")
    pip = [str(py), "-m", "pip", "install", "-q"]
    extras = ",".join(e for e, on in (("timm", timm), ("transformers", tf)) if on)
    # torch first and alone, so its wheel (the CPU build where one is on disk) is not replaced by the resolver
    steps = [pip + [f"torch=={torch}"], pip + ["-e", f"{ROOT}[{extras}]" if extras else str(ROOT), *pins, *TOOLS]]
    for cmd in steps:
        if run(cmd, log):
            raise SystemExit(f"compat: installing into {venv} failed: {' '.join(cmd[4:])} (log: {log})")
    stamp.write_text(want)
    return py


def installed(py: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m\nfor p in ('torch', 'timm', 'transformers', 'tokenizers', "
            "'huggingface-hub'):\n    try: print(p, m.version(p))\n    except m.PackageNotFoundError: print(p, '-')")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    return dict(line.split() for line in out)


def compat_files() -> list[str]:
    """The test files that carry the `compat` marker (their own `pytestmark`)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if re.search(r"pytest\.mark\.compat\b", p.read_text()))


def test(name: str, py: Path, log: Path) -> dict:
    xml = CACHE / f"{name}.xml"
    xml.unlink(missing_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": "",
           "CONDATTN_COMPAT": "1"}  # (tests/conftest.py: a test needing a package not installed here is skipped)
    t0 = time.perf_counter()
    rc = run([str(py), "-m", "pytest", "-q", "-m", "compat", "-p", "no:cacheprovider", f"--junitxml={xml}",
              *compat_files()], log, cwd=ROOT, env=env)
    secs = time.perf_counter() - t0
    counts = {"passed": 0, "failed": 0, "skipped": 0, "why": Counter()}
    if xml.exists():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        total, skipped = int(suite.get("tests")), int(suite.get("skipped"))
        failed = int(suite.get("failures")) + int(suite.get("errors"))
        counts = {"passed": total - skipped - failed, "failed": failed, "skipped": skipped}
        why = Counter(re.sub(r"^.*?: ", "", s.get("message", "")) for s in suite.iter("skipped"))
        counts["why"] = why
    return {"rc": rc, "secs": secs, **counts}


def commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return sha.strip() + (" (with uncommitted changes)" if dirty else "")


def record(py: Path, files: list[str], at: str, result: dict) -> dict:
    """One environment's run as runs.json keeps it: when, where (commit `at`, Python), what ran and what it gave."""
    return {"run": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M}", "commit": at, "python": sys.version.split()[0],
            "files": files, "versions": installed(py), **{k: result[k] for k in ("passed", "failed", "skipped", "rc")},
            "secs": round(result["secs"]), "why": dict(result["why"].most_common())}


def load() -> dict[str, dict]:
    return json.loads(RUNS.read_text()) if RUNS.exists() else {}


def save(runs: dict[str, dict]) -> None:
    RUNS.parent.mkdir(parents=True, exist_ok=True)
    RUNS.write_text(json.dumps(runs, indent=1, ensure_ascii=False) + "\n")


def _row(name: str, r: dict | None) -> str:
    if r is None:
        return f"| {name} | not run | | | | | | | | | FAIL | | |"
    v = r["versions"]
    return (f"| {name} | {v['torch']} | {v['timm']} | {v['transformers']} | {v['tokenizers']} | {v['huggingface-hub']} "
            f"| {r['passed']} | {r['failed']} | {r['skipped']} | {r['secs']} | {'pass' if r['rc'] == 0 else 'FAIL'} | "
            f"{r['run']} | {r['commit']}, Python {r['python']} |")


def write(runs: dict[str, dict]) -> None:
    """matrix.md from runs.json: every claimed environment's last run (a row that never ran fails the matrix)."""
    envs = claimed()
    ok = all(runs.get(n, {}).get("rc", 1) == 0 for n in envs)
    lines = [
        "# Compatibility matrix (generated by `make test-compat` from results/compat/runs.json; do not edit)",
        "",
        "Each environment holds torch, the timm / transformers releases named, pytest and condattn only (no harness "
        "package); `t2130` holds torch alone, the core install. The tests marked `compat` ran in each, on CPU. A row "
        "is that environment's last run, with its date and commit (`scripts/compat.py --only ENV` replaces that row).",
        "",
        "| environment | torch | timm | transformers | tokenizers | huggingface-hub | passed | failed | skipped "
        "| time (s) | result | run (UTC) | commit |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
        *(_row(n, runs.get(n)) for n in envs),
        "", "`-`: not installed. timm needs a torchvision built for the same torch, and PyPI's (a CUDA build) does not "
        "load beside the CPU torch 2.13.0 on this machine, so timm is tested on torch 2.14.1. A test that needs a "
        "package, or a model or option this release lacks, is skipped (tests/conftest.py, under CONDATTN_COMPAT=1); "
        "a layout that imports a package the model does not come from fails instead.",
        "", "Test files, by run:", "",
    ]
    by_files: dict[tuple, list[str]] = {}
    for n in envs:
        if n in runs:
            by_files.setdefault(tuple(runs[n]["files"]), []).append(n)
    lines += [f"- {', '.join(ns)}: {', '.join(f'`{f}`' for f in fs)}" for fs, ns in by_files.items()]
    lines += ["", "Skipped, by reason:", ""]
    lines += [f"- {n}: " + ("; ".join(f"{k} × {why}" for why, k in runs[n]["why"].items()) or "none")
              for n in envs if n in runs]
    lines += ["", f"Overall: {'pass' if ok else 'FAIL'}.", ""]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="ENV", help="run these environments only (their rows are replaced)")
    args = p.parse_args(argv)
    envs = claimed()
    if args.only:
        unknown = [n for n in args.only if n not in envs]
        if unknown:
            p.error(f"unknown environment {unknown[0]!r}; the environments are: {', '.join(envs)}")
        envs = {n: envs[n] for n in args.only}
    CACHE.mkdir(exist_ok=True)
    files, at = compat_files(), commit()  # (read before this run writes its results)
    runs, failed = load(), []
    for name, releases in envs.items():
        log = CACHE / f"{name}.log"
        log.write_text("")
        t0 = time.perf_counter()
        py = build(name, releases, log)
        print(f"compat: {name}: environment ready in {time.perf_counter() - t0:.0f} s", flush=True)
        r = runs[name] = record(py, files, at, test(name, py, log))
        save(runs)
        write(runs)
        failed += [name] if r["rc"] else []
        print(f"compat: {name}: {r['passed']} passed, {r['failed']} failed, {r['skipped']} skipped in "
              f"{r['secs']} s ({'pass' if r['rc'] == 0 else 'FAIL, log: ' + str(log)})", flush=True)
    print(f"compat: wrote {RUNS.relative_to(ROOT)} and {OUT.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
