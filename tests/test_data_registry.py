"""The dataset registry (each dataset registers its builder and its paper-data check; preflight loops over it) and
the shared file helpers (condattn/utils/files.py)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from condattn.config import compose
from condattn.data import (
    coco,
    glue,
    images,
    listops,
    lm_text,
    lra_image,
    lra_retrieval,
    lra_text,
    mlm_text,
    pathfinder,
)
from condattn.data.registry import (
    DATASETS,
    MODULES,
    DataBundle,
    build_datasets,
    data_root_exists,
    dataset_entry,
    register_dataset,
    registered,
)
from condattn.engine.preflight import preflight
from condattn.utils import files
from condattn.utils.io import write_json_atomic

CONDATTN = Path(__file__).resolve().parent.parent / "condattn"
BUILDERS = ("listops", "images", "lra_text", "lra_retrieval", "lra_image", "lra_pathfinder", "lm_text", "mlm_text",
            "glue", "coco")


def test_every_config_builder_is_registered():
    registered()
    used = {line.split(":", 1)[1].strip() for p in (CONDATTN.parent / "configs" / "data").glob("*.yaml")
            for line in p.read_text().splitlines() if line.startswith("builder:")}
    assert used and used <= set(DATASETS)
    assert set(BUILDERS) == set(DATASETS)
    assert len(MODULES) == len(set(MODULES))
    registering = {p.stem for p in (CONDATTN / "data").glob("*.py")
                   if p.name != "registry.py" and "\n@register_dataset(" in p.read_text()}
    assert registering == set(MODULES)


def test_each_dataset_carries_its_paper_data_check():
    expected = {"listops": listops.check_paper_data, "lm_text": lm_text.check_paper_data,
                "mlm_text": mlm_text.check_paper_data, "coco": coco.check_paper_data, "glue": glue.check_paper_data,
                "images": images._data_check, "lra_text": lra_text.check_paper_data,
                "lra_retrieval": lra_retrieval.check_paper_data, "lra_image": lra_image.check_paper_data,
                "lra_pathfinder": pathfinder.check_paper_data}
    for name in BUILDERS:
        assert dataset_entry(name).check is expected.get(name, data_root_exists), name


def test_unknown_builder_names_the_known_ones():
    cfg = compose(["data.builder=nope"])
    with pytest.raises(ValueError, match="unknown data builder 'nope'") as e:
        build_datasets(cfg)
    assert all(name in str(e.value) for name in BUILDERS)
    assert any("unknown data builder 'nope'" in p.message and "listops" in p.message
               for p in preflight(cfg, check_run_dir=False))


def test_preflight_calls_the_registered_check(tmp_path, monkeypatch):
    calls = []

    def check(cfg):
        calls.append(cfg.data.builder)
        raise FileNotFoundError("toy files are not at /toy")

    def build(cfg):  # pragma: no cover - never built here
        raise AssertionError

    monkeypatch.delitem(DATASETS, "toy", raising=False)
    register_dataset("toy", check=check)(build)
    try:
        cfg = compose(["scale=paper", "data.builder=toy", f"data.root={tmp_path}"])
        msgs = [p.message for p in preflight(cfg, check_run_dir=False) if p.kind == "data"]
        assert calls == ["toy"] and msgs == ["paper-scale data missing: toy files are not at /toy"]
        with pytest.raises(ValueError, match="registered twice"):
            register_dataset("toy")(lambda cfg: None)
    finally:
        DATASETS.pop("toy", None)


@pytest.mark.slow
def test_registry_imports_no_dataset_module():
    """Dataset modules import the registry; the registry names them only as strings (MODULES), so no cycle closes."""
    tree = ast.parse((CONDATTN / "data" / "registry.py").read_text())
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert not imported & {*MODULES, "condattn.data"}
    code = ("import sys, condattn.data.listops as m; from condattn.data.registry import registered; "
            "print(len(registered()), 'condattn.data.coco' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(CONDATTN.parent)})
    assert out.stdout.split() == [str(len(MODULES)), "True"]


def test_standins_sit_below_the_dataset_modules():
    """The generators import the release layouts and shared helpers only; the dataset modules choose between them."""
    allowed = {"condattn.utils.files", "condattn.data.lra_layouts", "condattn.data.lra_common", "condattn.data.common"}
    for path in (CONDATTN / "data" / "standins").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ["condattn", "data", "standins"][: 3 - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                assert target in allowed or target.startswith("condattn.data.standins."), (path.name, target)


@pytest.mark.slow
def test_glue_task_table_is_a_leaf():
    """`${glue_num_labels:TASK}` reads the task table without loading the GLUE data code."""
    tree = ast.parse((CONDATTN / "data" / "glue_tasks.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses"}
    code = ("import sys; import condattn.config; from omegaconf import OmegaConf; "
            "c = OmegaConf.create({'a': '${glue_num_labels:stsb}', 'b': '${glue_num_labels:mnli}'}); "
            "print(c.a, c.b, 'condattn.data.glue' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(CONDATTN.parent)})
    assert out.stdout.split() == ["1", "3", "False"]


def test_atomic_writers(tmp_path):
    files.write_bytes_atomic(tmp_path / "a" / "b.bin", b"\x00\x01")
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    files.write_text_atomic(tmp_path / "t.txt", "é\nx\n")
    assert (tmp_path / "t.txt").read_bytes() == "é\nx\n".encode()
    obj = {"b": 1, "a": [1.5, None], "p": Path("/x")}
    write_json_atomic(tmp_path / "s.json", obj)  # the run records' format: indented, str() for the rest
    assert (tmp_path / "s.json").read_text() == json.dumps(obj, indent=2, default=str)
    assert not list(tmp_path.glob(".*.tmp"))


def test_atomic_write_leaves_the_old_file_on_failure(tmp_path):
    target = tmp_path / "keep.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        files.write_bytes_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_text() == "old" and not list(tmp_path.glob(".*.tmp"))


def test_files_checksum_is_sha256_of_the_concatenation(tmp_path):
    paths = []
    for i, data in enumerate((b"abc", b"", b"x" * (3 << 20))):
        paths.append(tmp_path / f"{i}")
        paths[-1].write_bytes(data)
    assert files.files_checksum(paths) == hashlib.sha256(b"abc" + b"x" * (3 << 20)).hexdigest()
    split = {"val": paths[0], "test": paths[2], "train": paths[1]}
    assert listops.file_checksum(split) == files.files_checksum([paths[2], paths[1], paths[0]])  # sorted split names


def test_ensure_generated_records_and_redoes(tmp_path):
    made = []

    def gen(out):
        made.append(out)
        (out / "f").write_text(str(len(made)))

    out = files.params_dir(tmp_path, "toy", {"n": 1})
    assert out == tmp_path / "toy" / hashlib.sha256(b'{"n": 1}').hexdigest()[:10]
    files.ensure_generated(out, {"n": 1}, ["f"], gen)
    files.ensure_generated(out, {"n": 1}, ["f"], gen)
    assert len(made) == 1 and json.loads((out / "generation.json").read_text()) == {"n": 1}
    files.ensure_generated(out, {"n": 2}, ["f"], gen)  # other parameters
    (out / "f").unlink()
    files.ensure_generated(out, {"n": 2}, ["f"], gen)  # a file gone
    (out / "generation.json").write_text("{trunc")
    files.ensure_generated(out, {"n": 2}, ["f"], gen)  # a torn record
    assert len(made) == 4


def test_databundle_defaults():
    b = DataBundle([], [], None, "c")
    assert b.info == {} and b.sampler_factory is None and b.collate_fn is None
