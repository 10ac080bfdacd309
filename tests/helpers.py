"""Shared test helpers: tiny models and their inputs, and the before/after snapshot of a model. Test modules import
them with `from helpers import ...` (pytest puts tests/ on sys.path); fixtures and tier rules stay in conftest.py."""

from __future__ import annotations

import ast
import copy
import functools
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def parsed(source: str) -> ast.Module:
    """`ast.parse(source)`, once a process: several tests walk every module of the package (read the tree, never
    change it)."""
    return ast.parse(source)


def tiny_vit():
    import timm

    torch.manual_seed(0)
    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=10
    ).eval()


def tiny_nystromformer(seq_len: int = 128):
    from condattn.models.lra import NystromformerClassifier

    torch.manual_seed(0)
    return NystromformerClassifier(vocab_size=19, num_classes=10, seq_len=seq_len, num_landmarks=64).eval()


def vit_inputs(b: int = 3) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"x": torch.randn(b, 3, 32, 32, generator=g)}


def nystrom_inputs(b: int = 3, seq_len: int = 128) -> dict:
    """Right-padded token batches with different lengths (sample 0 unpadded)."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, 19, (b, seq_len), generator=g)
    mask = torch.ones(b, seq_len, dtype=torch.long)
    for i in range(1, b):
        n = seq_len - 17 * i
        ids[i, n:] = 0
        mask[i, n:] = 0
    return {"input_ids": ids, "attention_mask": mask}


MODELS = {
    "vit": (tiny_vit, vit_inputs),
    "nystromformer": (tiny_nystromformer, nystrom_inputs),
}


def mini_listops(tmp: Path, *extra: str) -> list[str]:
    """Overrides of a 4-step ListOps run, batch 8, length 64, writing under `tmp` (as tests/test_train.py)."""
    return [
        "scale=smoke", "logger=none", f"paths.runs={tmp / 'runs'}", f"paths.cache={tmp / 'cache'}",
        "data.generate.train=64", "data.generate.val=24", "data.generate.test=16", "data.generate.min_length=20",
        "data.generate.max_length=60", "data.max_length=64", "data.seq_len=64", "task.batch_size=8", "task.steps=4",
        "task.eval_every=2", "task.log_every=1", "impl.checkpoint_every=2", "diagnostics.batch_size=2", *extra,
    ]


def assert_compiles_like_eager(model: torch.nn.Module, x: torch.Tensor, ref: torch.Tensor) -> None:
    """torch.compile(fullgraph=True, backend=aot_eager) of a copy of `model`: in train mode its gradients equal
    eager's (parameters that get one), and in eval mode its output equals `ref`."""
    import copy

    torch._dynamo.reset()
    eager = copy.deepcopy(model).train()
    eager(x).sum().backward()
    compiled_model = copy.deepcopy(model).train()
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    compiled(x).sum().backward()
    for (n, a), b in zip(eager.named_parameters(), compiled_model.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=n)
    compiled_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref, atol=1e-5, rtol=1e-5)


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, ulps: float, why: str = "") -> None:
    """Two routes to one float32 value (a reference's code beside ours, a reloaded model beside the saved one) agree
    only to rounding, which differs with the CPU's kernels: every element within `ulps` float32 ulps of the expected
    tensor's largest magnitude. Pick `ulps` from the route's depth (each layer and step compounds rounding) with a
    margin of about 10x over what was measured on AVX-512, AVX2 and the plain kernels; a real difference in logic is
    orders of magnitude larger. Bits are compared (torch.equal) only where the same operations run on the same inputs
    in the same order."""
    expected = expected.detach()
    scale = float(expected.abs().max())
    bound = ulps * torch.finfo(torch.float32).eps * scale
    worst = float((actual.detach() - expected).abs().max())
    assert worst <= bound, (f"max |difference| {worst:.3g} exceeds {ulps:g} float32 ulps of the values' scale "
                            f"{scale:.3g} (bound {bound:.3g}){': ' + why if why else ''}")


def snapshot(model: torch.nn.Module, x: torch.Tensor) -> dict:
    """What a refusal or a removal must leave as it was: weights, module types, hooks, condattn attributes, output."""
    with torch.no_grad():
        out = model(x)
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "types": [(n, type(m)) for n, m in model.named_modules()],
        "hooks": [(n, len(m._forward_pre_hooks), len(m._forward_hooks)) for n, m in model.named_modules()],
        "attrs": [(n, sorted(k for k in vars(m) if k.startswith("_condattn"))) for n, m in model.named_modules()],
        "out": out,
    }


def assert_identical(before: dict, after: dict) -> None:
    assert before["types"] == after["types"]
    assert before["hooks"] == after["hooks"]
    assert before["attrs"] == after["attrs"]
    assert before["state"].keys() == after["state"].keys()
    assert all(torch.equal(before["state"][k], after["state"][k]) for k in before["state"])
    assert torch.equal(before["out"], after["out"])


def experiment_raw(name: str | Path) -> dict:
    """An experiment file as its YAML mapping (`name`: a path, or a stem under experiments/): a test edits it, then
    `typed()` parses it as condattn does."""
    import yaml

    path = Path(name) if str(name).endswith(".yaml") else REPO / "experiments" / f"{name}.yaml"
    return yaml.safe_load(path.read_text())


def typed(raw: dict):
    """The typed Experiment of an (edited) experiment mapping."""
    from condattn.experiment import parse

    return parse(copy.deepcopy(raw))


def plan_of(exp, scale: str, runs_root, results_root, seeds=None, **fields):
    """A Plan for a renderer's test (no cell composed): `exp` typed or a mapping, the runs and results where the test
    put them, the reported seeds (default: the scale's) and any other Plan field (picks, variants, longer, ...)."""
    from condattn.experiment import Experiment
    from condattn.table.planned import Plan

    exp = exp if isinstance(exp, Experiment) else typed(exp)
    seeds = exp.at(scale).seeds if seeds is None else seeds
    return Plan(exp, scale, tuple(seeds), Path(runs_root), Path(results_root), **fields)


def provenance_of(**fields):
    """A table's Provenance (condattn/table/provenance.py) for a view's test: no runs, but for `fields`."""
    from condattn.table.provenance import Data, Provenance, walls_of

    empty = dict(scale="small", data=Data.NONE, seeds=(), commits=(), commit_states=(), aliased=(), hardware=(),
                 threads=(), cpu_capabilities=(), runs=0, reused=(), gpu_hours=0.0, gpu_runs=0, validation=(),
                 walls=walls_of([]), walls_by=(), code=(), spent=None, written_at="2026-01-02T03:04:00+00:00")
    return Provenance(**{**empty, **fields})
