"""The method library needs torch alone (issue 54): every registered method on the home-made models of
tests/own_model.py (separate q/k/v, a fused `qkv`, nanoGPT's `c_attn`, nn.TransformerEncoder) patches and trains, or
refuses in one line with its reason; never an ImportError.

- slow: a fresh interpreter in which timm, transformers, numpy and the harness's packages cannot be imported trains
  each patched pair two steps (finite losses that change, gradients reaching every patched attention layer);
- unit: every registered layout finder, and every method, on the same models in this process with timm and
  transformers imports made to fail (layouts ask sites.of_library before they import either).

scripts/compat.py runs both in each compatibility environment, torch alone included (results/compat/matrix.md).
"""

from __future__ import annotations

import builtins
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import condattn
from condattn.conditioning import METHODS
from condattn.conditioning.sites import ATTENTION_LAYOUTS, TOKEN_LAYOUTS, of_library

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from own_model import HOME_MADE  # noqa: E402  (tests/ on the path: own_model is also a --model module)

pytestmark = pytest.mark.compat  # (scripts/compat.py)

BLOCKED = ("timm", "transformers", "safetensors", "tokenizers", "huggingface_hub", "numpy", "hydra", "omegaconf",
           "accelerate", "wandb", "datasets", "torchvision", "matplotlib", "pandas", "scipy", "sklearn", "yaml")
OPTIONAL = ("timm", "transformers")  # what the layouts import (the in-process check blocks these)
# (method, model) -> the words of its one-line refusal; every other pair patches and trains (CET finds its token site
# by structure: layouts/structural_tokens.py)
REFUSES = {
    **{(m, d): "refused on the causal decoder" for m in ("embedded", "spectral+embedded")
       for d in ("nanogpt", "meta_style")},
    ("ns_attention", "meta_style"): "is causal self-attention",  # (read from its SDPA call's is_causal=True)
    ("ns_attention", "nanogpt"): "is causal self-attention",  # (its class says is_causal, as transformers' do)
    ("ns_attention", "torch_encoder"): "applies encoder.layers.0.self_attn.out_proj inside its own forward",
    ("qk_norm", "torch_encoder"): "MultiheadAttention reads its projection weight itself",
    # the logit methods need the logits, which nn.MultiheadAttention computes inside F.multi_head_attention_forward
    **{(m, "torch_encoder"): "inside F.multi_head_attention_forward" for m in ("attention_sink", "softcap", "qk_clip")},
    ("gated_attention", "torch_encoder"): "takes a gate",  # its W_Q is read as a weight, never called as a module
}
# a composite refuses where one of its parts does, with that part's reason
REFUSES.update({(f"qk_norm+{m}", name): REFUSES.get(("qk_norm", name)) or REFUSES[m, name]
                for m in ("spectral", "embedded", "conditioned_init") for name in HOME_MADE
                if ("qk_norm", name) in REFUSES or (m, name) in REFUSES})


def outcome(method: str, name: str, steps: int = 0) -> dict:
    """Apply `method` to the home-made model `name` and train `steps` AdamW steps: {"patched": counts, "losses",
    "no_grad": patched layers no gradient reached}, {"refused": message} or {"error": type and message}."""
    model, batch, loss_fn = HOME_MADE[name]()
    try:
        report = condattn.apply_conditioning(model, method)
    except (ValueError, RuntimeError) as e:  # condattn's refusals
        return {"refused": str(e)}
    except Exception as e:  # noqa: BLE001  (an ImportError above all: reported, never raised)
        return {"error": f"{type(e).__name__}: {e}"}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, no_grad = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(float(loss))
        layers = {e.module.partition("#")[0].removesuffix(" input") for e in report.entries}  # (CET: "<block> input")
        no_grad = sorted(n for n in layers if not any(p.grad is not None and p.grad.abs().sum() > 0
                                                      for p in model.get_submodule(n).parameters()))
        no_grad += [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()]
        opt.step()
    return {"patched": report.counts, "losses": losses, "no_grad": no_grad}


def child() -> None:
    """The fresh interpreter's side: after BLOCKED were made unimportable, one JSON line per (method, model)."""
    import importlib.util

    present = [n for n in BLOCKED if importlib.util.find_spec(n) is not None]
    assert not present, f"not blocked: {present}"
    torch.set_num_threads(1)
    for method in METHODS:
        for name in HOME_MADE:
            print(json.dumps({"method": method, "model": name, **outcome(method, name, steps=2)}), flush=True)
    leaked = [n for n in BLOCKED if sys.modules.get(n) is not None]
    assert not leaked, f"imported although blocked: {leaked}"


CHILD = ("import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None  # import raises ModuleNotFoundError\n"
         "sys.path.insert(0, {tests!r})\nimport test_torch_alone\ntest_torch_alone.child()\n")


def check(method: str, name: str, got: dict) -> None:
    """A pair patches (and trained, where it ran steps) or refuses in one line with the words REFUSES expects."""
    pair = f"{method} on {name}"
    assert "error" not in got, f"{pair}: {got.get('error')}"
    if (method, name) in REFUSES:
        assert "refused" in got, f"{pair} patched ({got['patched']}), expected a refusal: {REFUSES[method, name]}"
        msg = got["refused"]
        assert REFUSES[method, name] in msg and "\n" not in msg and "No module named" not in msg, f"{pair}: {msg}"
        return
    assert "patched" in got, f"{pair} refused: {got.get('refused')}"
    assert (method == "none") == (not got["patched"]), f"{pair}: {got['patched']}"
    losses = got["losses"]
    assert all(math.isfinite(v) for v in losses) and len(set(losses)) == len(losses), f"{pair}: losses {losses}"
    assert not got["no_grad"], f"{pair}: no (finite) gradient in {got['no_grad']}"


@pytest.mark.slow  # a fresh interpreter; trains 36 pairs two steps (about 10 s)
def test_every_method_on_home_made_models_with_torch_alone():
    code = CHILD.format(blocked=BLOCKED, tests=str(TESTS))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=240,
                         env=env, cwd=TESTS)
    assert out.returncode == 0, out.stderr[-3000:]
    got = {(r["method"], r["model"]): r for r in map(json.loads, out.stdout.splitlines())}
    assert set(got) == {(m, n) for m in METHODS for n in HOME_MADE}
    for (method, name), r in got.items():
        check(method, name, r)


@pytest.fixture
def no_timm_nor_transformers(monkeypatch):
    """`import timm…` / `import transformers…` (statements and importlib.import_module) raise in this process."""
    real_import, real_module = builtins.__import__, importlib.import_module

    def refuse(name: str) -> None:
        if name.partition(".")[0] in OPTIONAL:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)

    def blocked_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            refuse(name)
        return real_import(name, globals, locals, fromlist, level)

    def blocked_module(name, package=None):
        refuse(name)
        return real_module(name, package)

    monkeypatch.setattr(builtins, "__import__", blocked_import)
    monkeypatch.setattr(importlib, "import_module", blocked_module)


@pytest.mark.parametrize("name", list(HOME_MADE))
def test_no_layout_finder_imports_timm_or_transformers_for_a_home_made_model(name, no_timm_nor_transformers):
    model = HOME_MADE[name]()[0]
    for kind, registry in (("attention", ATTENTION_LAYOUTS), ("token", TOKEN_LAYOUTS)):
        for layout, finder in registry.items():
            for path, m in model.named_modules():
                try:
                    finder(path, m)
                except ImportError as e:  # (a failure, never the compat run's skip of a missing package)
                    pytest.fail(f"{kind} layout {layout!r} imported {e.name} on {path or '<model>'} "
                                f"({type(m).__name__}): ask sites.of_library first")


@pytest.mark.parametrize(("method", "name"), [(m, n) for m in METHODS for n in HOME_MADE])
def test_every_method_patches_or_refuses_without_timm_or_transformers(method, name, no_timm_nor_transformers):
    check(method, name, outcome(method, name))


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("name", ["separate_qkv", "fused_qkv", "nanogpt"])
def test_torch_fx_traces_the_gate_outside_timms_slot(name, gate):
    """gated_attention on a layer without timm's `gate` slot (a home-made one here, timm < 1.0.16's `Attention`):
    W_Q and W_O switch class, and the gate's shape checks, which torch.fx cannot trace, are left out of the graph; the
    traced graph computes the eager model's numbers."""
    model, batch, _ = HOME_MADE[name]()
    rep = condattn.apply_conditioning(model.eval(), "gated_attention", gate=gate)
    assert rep.count("gated_attention") == 2
    graph = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(graph(batch["ids"]), model(batch["ids"]), rtol=1e-6, atol=1e-6)


def test_of_library_reads_class_and_base_modules():
    class Mine(torch.nn.MultiheadAttention):
        pass

    assert of_library(torch.nn.Linear(2, 2), "torch") and of_library(Mine(4, 2), "torch")
    assert not any(of_library(HOME_MADE["fused_qkv"]()[0].blocks[0].attn, lib) for lib in OPTIONAL)
    timm = pytest.importorskip("timm")
    attn = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1).blocks[0].attn

    class Subclass(type(attn)):  # a user's subclass of a timm class is still timm's layout's business
        pass

    assert of_library(attn, "timm") and not of_library(attn, "transformers") and of_library(Subclass(64, 2), "timm")
    assert not of_library(attn, "tim")  # a package name, not a prefix of one


DIAGNOSE = ("import runpy, sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
            "sys.argv = ['condattn.diagnose', *{args!r}]\nrunpy.run_module('condattn.diagnose', run_name='__main__')\n")


@pytest.mark.slow  # two fresh interpreters
def test_diagnose_own_model_needs_torch_alone():
    """`python -m condattn.diagnose --model` with no harness package (a pip-installed condattn): the table; a
    configured model there: one line naming the extra."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}

    def diagnose(*args):
        code = DIAGNOSE.format(blocked=BLOCKED, args=list(args))
        return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                              timeout=120, env=env, cwd=TESTS)

    own = diagnose("--model", "own_model:fused_qkv", "conditioning.lam=2", "conditioning.targets=[q,k]")
    assert own.returncode == 0, own.stderr[-3000:]
    assert "own_model:fused_qkv, baseline (none) → spectral(lam=2, targets=['q', 'k'])" in own.stdout
    assert "patch: spectral:structural ×2" in own.stdout
    configured = diagnose("model=vit")
    assert configured.returncode == 2 and configured.stdout == ""
    assert configured.stderr == ("diagnose: a configured model (Hydra overrides) needs the harness, and omegaconf is "
                                 "not installed: pip install 'condattn[harness]'; your own model needs torch alone: "
                                 "--model MODULE:CALLABLE\n")


@pytest.mark.parametrize(("text", "value"), [("2", 2), ("-1", -1), ("1e-3", 1e-3), ("2.5", 2.5), ("true", True),
                                             ("null", None), ("svd", "svd"), ('"10"', "10"), ("'10'", "10"),
                                             ("[q, k]", ["q", "k"]), ("[]", [])])
def test_diagnose_reads_override_values_without_yaml(text, value):
    from condattn.diagnose import _override_value

    got = _override_value(text)
    assert got == value and type(got) is type(value)
