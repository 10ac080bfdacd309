"""The documentation: the site (mkdocs.yml, docs/) builds with `mkdocs build --strict` (a broken link, a missing
anchor or page, or a docstring mkdocstrings cannot render fails it), the API reference covers the public API, and the
README stays a landing page whose relative links name files that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import condattn
import condattn.conditioning
import condattn.diagnostics

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)


def relative_links(text: str) -> list[str]:
    """The relative link targets of a markdown text, fragments dropped (http(s), mailto and bare #anchors left out)."""
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    """`make docs` as a test: any warning (a link to a missing page or anchor, a page left out of the nav, an object
    mkdocstrings cannot find) fails the build."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: install the docs extra (`pip install -e '.[docs]'`, "
                                         "part of `make install`)")
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for page in ("getting-started", "harness", "protocol", "runs", "cluster", "data", "benchmarks", "architecture",
                 "tests", "coverage", "api/api", "api/spec", "api/sites", "api/diagnostics"):
        assert (site / page / "index.html").exists(), page
    api = (site / "api" / "api" / "index.html").read_text()
    assert "Undo" in api and "apply_conditioning" in api, "the API page carries remove_conditioning's docstring"


def test_the_api_reference_names_every_public_name():
    """Each name of condattn.__all__, condattn.conditioning.__all__ and condattn.diagnostics.__all__ has a `:::`
    entry on an API page (under the package the user imports it from, or the one that re-exports it)."""
    documented = set()
    for page in (REPO / "docs" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M))
    top = {f"condattn.{n}" for n in condattn.__all__ if n != "__version__"}
    missing = [n for n in sorted(top) if n not in documented and n.replace("condattn.", "condattn.conditioning.", 1)
               not in documented]
    for mod in (condattn.conditioning, condattn.diagnostics):
        missing += [f"{mod.__name__}.{n}" for n in mod.__all__ if f"{mod.__name__}.{n}" not in documented
                    and f"condattn.{n}" not in documented]
    assert not missing, f"add a `::: name` line for each to a page of docs/api/: {missing}"


def test_every_relative_link_of_the_readme_names_a_file_that_exists():
    readme = (REPO / "README.md").read_text()
    links = relative_links(readme)
    assert "docs/getting-started.md" in links and "docs/cluster.md" in links  # the landing page links into the docs
    missing = [t for t in links if not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_relative_links_are_found():
    """The link check can fail: it sees relative targets and leaves URLs and anchors alone."""
    text = "[a](docs/nope.md#x) [b](https://example.org/x.md) [c](#local) [d](LICENSE) `[e](not/a/link)`"
    assert relative_links(text) == ["docs/nope.md", "LICENSE", "not/a/link"]
    assert not (REPO / "docs/nope.md").exists()


def test_the_readme_is_a_landing_page():
    """At most about 200 lines; the manual lives in docs/. The findings block `make findings` writes stays in it."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "move sections of README.md into docs/ (the README is a landing page)"
    assert "<!-- findings:small:begin -->" in readme and "<!-- findings:small:end -->" in readme
    for command in ("make install", "make test", "make reproduce-table-4 SCALE=smoke", "make docs"):
        assert command in readme, command


def test_the_readmes_library_example_runs_as_written():
    """The README's first Python block, torch only: SCA on a home-made nn.TransformerEncoder patches its 2 attention
    layers, as its comment says, and removing it gives the model back."""
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("\n", 1)[1] for b in readme.split("```")[1::2] if b.startswith("python\n")]
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    assert ns["report"].counts == {"spectral:torch_mha": 2}
    assert "spectral:torch_mha: 2" in blocks[0] and tuple(ns["y"].shape) == (8, 16, 64)


# Test counts and times have one home, docs/tests.md ("Measured counts and times", with the commit they were measured
# at); every other page links there. A count of tests, or a time given to `make test` / `make test-unit`, elsewhere
# is a second source that goes stale.
MEASURED_HERE = "docs/tests.md"
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:(?:unit|slow|gpu|compat)\s+)?tests\b"
                        r"|\b\d[\d,]*\s+(?:passed|skipped|failed)\b")
TEST_TARGET = re.compile(r"make test(?:-unit)?(?![\w-])")
DURATION = re.compile(r"\b\d+(?:[.,]\d+)?\s*(?:s|sec|seconds?|min|minutes?|h|hours?)\b|\b(?:under|about) a minute\b")


def count_claims(text: str) -> list[str]:
    """The lines of a page that state a count of tests, or a time for `make test` / `make test-unit`."""
    return [line.strip() for line in text.splitlines()
            if TEST_COUNT.search(line) or (TEST_TARGET.search(line) and DURATION.search(line))]


def test_the_count_check_sees_counts_and_times():
    """The check can fail: counts and test-target times are seen; other numbers, other targets' times are not."""
    seen = ["make test   # ruff + the suite (1,491 tests, about 8 min)", "the unit tier (1,192 unit tests)",
            "1,489 passed, 2 skipped", "`make test-unit` runs the unit tier alone (under a minute)",
            "make test        # 7 min 40 s"]
    unseen = ["validation the official 10,000 test images", "make test-compat  # minutes; 12 s per venv",
              "make reproduce-table-5 SCALE=smoke takes about 1 min", "make test   # ruff + the whole suite",
              "transformers' common tests under every method, 20.7 min"]
    assert count_claims("\n".join(seen)) == seen
    assert count_claims("\n".join(unseen)) == []


def test_only_the_tests_page_gives_test_counts_and_times():
    pages = [REPO / "README.md", REPO / "Makefile", *sorted((REPO / "docs").rglob("*.md"))]
    found = {str(p.relative_to(REPO)): claims for p in pages if str(p.relative_to(REPO)) != MEASURED_HERE
             and (claims := count_claims(p.read_text()))}
    assert not found, (f"test counts and times belong in {MEASURED_HERE} (with the commit they were measured at); "
                       f"link there instead: {found}")
    assert "## Measured counts and times" in (REPO / MEASURED_HERE).read_text()


def table_numbers(text: str) -> set[int]:
    """'1, 3, 4 and 9' → {1, 3, 4, 9}."""
    return {int(n) for n in re.findall(r"\d+", text)}


def test_the_tables_said_to_have_a_medium_scale_define_one():
    """docs/harness.md names the tables with a medium scale, and those with neither a medium nor a small one: a scale
    exists where the experiment file defines it (`scales:`, Experiment.at)."""
    from condattn.experiment import load

    scales = {int(re.match(r"table(\d+)_", p.name).group(1)): set(load(p).scales)
              for p in (REPO / "experiments").glob("table*_*.yaml")}
    harness = (REPO / "docs" / "harness.md").read_text()
    medium = re.search(r"`make reproduce-table-N SCALE=medium` exists for tables ([\d, and]+)", harness)
    neither = re.search(r"Detection \(tables ([\d, and]+)\) has no medium and no small scale", harness)
    assert medium and neither, "docs/harness.md no longer says which tables have a medium scale: update this test"
    assert table_numbers(medium.group(1)) == {t for t, s in scales.items() if "medium" in s}
    assert table_numbers(neither.group(1)) == {t for t, s in scales.items() if not {"medium", "small"} & s}
    cifar = re.search(r"## CIFAR \(medium scale of tables ([\d, and]+)\)", (REPO / "docs" / "data.md").read_text())
    assert cifar and table_numbers(cifar.group(1)) <= {t for t, s in scales.items() if "medium" in s}
