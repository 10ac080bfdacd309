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
