"""The 2025 rivals (gated_attention, softcap, attention_sink, qk_clip) and the QK-norm composites in the Hydra harness:
each is a `conditioning=` option whose options carry their modules' defaults, its option values name distinct runs
(options of other methods are refused and never rename one), it trains through `python -m condattn.train`, resumes,
and its step-0 diagnostics read the attention it really computes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import condattn
from condattn.conditioning import spec as S
from condattn.conditioning.spec import conditioning_spec, method_spec
from condattn.config import CONFIG_DIR, compose
from condattn.engine.identity import config_hash, science_config

REPO = Path(__file__).resolve().parents[1]
RIVALS = ("gated_attention", "softcap", "attention_sink", "qk_clip", "qk_norm+spectral", "qk_norm+embedded",
          "qk_norm+conditioned_init")

pytestmark = pytest.mark.usefixtures("one_thread")


def _yaml(name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / "conditioning" / f"{name}.yaml").read_text())


# ---------------------------------------------------------------- configs: one source of truth for the defaults


def test_every_registered_method_has_its_config():
    for m in S.METHODS:
        node = _yaml(m)
        assert node == {"defaults": ["_options", "_self_"], "method": m}, m


def test_options_yaml_holds_every_option_of_every_method_at_its_modules_default():
    yaml_opts = _yaml("_options")
    assert set(yaml_opts) == set(S._OPTIONS)  # no option missing, none that no method reads
    for m in S.METHODS:
        module = method_spec(m).options  # the defaults as its module registers them
        for key, default in module.items():
            assert (list(default) if isinstance(default, tuple) else default) == yaml_opts[key], (m, key)
        # and as its checks read them: the yaml node composes the very spec the module's defaults make
        assert conditioning_spec(method=m, **{k: yaml_opts[k] for k in module}) == conditioning_spec(method=m), m


# ---------------------------------------------------------------- identity: values of its own options only


@pytest.mark.parametrize("method, a, b", [
    ("gated_attention", {"gate": "headwise"}, {}),
    ("softcap", {"softcap_cap": 30}, {"softcap_cap": 50}),
    ("qk_clip", {"qk_clip_tau": 50}, {}),
    ("qk_clip", {"qk_clip_alpha": 0.25}, {}),
    ("qk_norm+spectral", {"lam": 2}, {}),
    ("qk_norm+spectral", {"norm": "rmsnorm"}, {}),
    ("qk_norm+embedded", {"solver": "svd"}, {}),
    ("qk_norm+conditioned_init", {"targets": ["q", "k"]}, {}),
])
def test_the_identity_tells_option_values_apart(method, a, b):
    assert conditioning_spec(method=method, **a).identity() != conditioning_spec(method=method, **b).identity()


@pytest.mark.parametrize("method, other", [
    ("gated_attention", {"softcap_cap": 30}),
    ("softcap", {"gate": "headwise", "qk_clip_tau": 5}),
    ("attention_sink", {"softcap_cap": 30, "lam": 2}),
    ("qk_clip", {"gate": "headwise"}),
    ("qk_norm+spectral", {"softcap_cap": 30, "solver": "svd"}),
    ("qk_norm+conditioned_init", {"lam": 2}),  # conditioned init reads SCA's targets, not its λ
])
def test_options_a_method_does_not_use_leave_its_identity_alone(method, other):
    spec = conditioning_spec(method=method, **other)
    assert spec.identity() == conditioning_spec(method=method).identity()
    assert spec.ignored(other) == list(other)  # (the CLI refuses each: options_not_applying)


def test_the_science_config_hashes_softcap_30_and_50_apart_and_the_default_is_50():
    def h(*extra: str) -> str:
        return config_hash(science_config(compose(["task=imagenet_vit", "scale=smoke", *extra])))

    assert h("conditioning=softcap", "conditioning.softcap_cap=30") != h("conditioning=softcap")
    assert h("conditioning=softcap", "conditioning.softcap_cap=50") == h("conditioning=softcap")
    assert h("conditioning=spectral", "conditioning.softcap_cap=30") == h("conditioning=spectral")


# ---------------------------------------------------------------- the diagnostics read the rule's own attention


def _sharp(model: torch.nn.Module) -> torch.nn.Module:
    """W_Q and W_K × 8: logits far from 0, so that the attention at init is not near uniform."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("qkv.weight", "q_proj.weight", "k_proj.weight")):
                rows = 2 * p.shape[1] if name.endswith("qkv.weight") else p.shape[0]  # (timm's qkv: q and k rows)
                p[:rows].mul_(8)
    return model.eval()


def _vit():
    import timm

    torch.manual_seed(0)
    return _sharp(timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                                    embed_dim=64, num_heads=2, depth=2, num_classes=10))


def _llama_lm():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=32)
    return _sharp(tf.LlamaModel(cfg))


@pytest.mark.parametrize("family", ["timm", "transformers"])
def test_attention_diagnostics_see_the_cap_and_the_sink(family):
    """A cap of 1e-3 flattens every logit to ~0, so the attention read is uniform over the keys each query may see
    (causal on the Llama); a sink of 0 is one more uniform key. Reading the layer through eager / unfused attention
    instead (the probe's usual switch) would bypass both, and on timm it raised."""
    from condattn.diagnostics.attention import attention_entropy

    if family == "timm":
        build, batch, run = _vit, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), \
            (lambda m, x: m(x))
    else:
        build, batch, run = _llama_lm, torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0)), \
            (lambda m, x: m(x, use_cache=False))
    plain = attention_entropy(build(), run, batch)
    assert all(r["entropy"] < r["entropy_uniform"] - 0.05 for r in plain)  # the model's own attention is not flat
    capped = build()
    condattn.apply_conditioning(capped, "softcap", softcap_cap=1e-3)
    rows = attention_entropy(capped, run, batch)
    assert [r["reader"] for r in rows] == ["logits_rule"] * 2
    assert all(r["entropy"] == pytest.approx(r["entropy_uniform"], abs=1e-5) for r in rows)
    sunk = build()
    condattn.apply_conditioning(sunk, "attention_sink")
    rows = attention_entropy(sunk, run, batch)
    assert all(r["absent"] is None and r["reader"] == "logits_rule+sink" for r in rows)
    assert all(r["self_argmax"] is not None for r in rows)  # query i's own key is still key i (the sink's is last)
    n = batch.shape[-1] if family == "transformers" else 17  # tokens: 16 patches + CLS
    expected = math.log(n + 1) if family == "timm" else sum(math.log(i + 2) for i in range(n)) / n
    assert all(r["entropy_uniform"] == pytest.approx(expected) for r in rows)  # the sink is one more key
    clipped = build()
    condattn.apply_conditioning(clipped, "qk_clip")  # reads the logits only: the model's own attention
    assert [r["entropy"] for r in attention_entropy(clipped, run, batch)] == \
        pytest.approx([r["entropy"] for r in plain], rel=1e-6)


# ---------------------------------------------------------------- the harness end to end


def overrides(tmp: Path, *extra: str) -> list[str]:
    """A 4-step ViT run at smoke scale (16 patches + CLS, width 64) writing under `tmp`."""
    return ["task=imagenet_vit", "scale=smoke", "logger=none", f"paths.runs={tmp / 'runs'}",
            f"paths.cache={tmp / 'cache'}", "task.steps=4", "task.eval_every=2", "impl.checkpoint_every=2",
            "impl.threads=1", "diagnostics.batch_size=2", *extra]


@pytest.mark.slow
def test_each_method_trains_through_the_cli_and_its_summary_names_it(tmp_path):
    from condattn.engine.provenance import code_fingerprint

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "condattn.train", "-m", *overrides(tmp_path),
                          f"conditioning={','.join(RIVALS)}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    for m in RIVALS:
        (run_dir,) = (tmp_path / "runs" / "smoke").glob(f"imagenet_vit_{m}_smoke_s0-*")
        s = json.loads((run_dir / "summary.json").read_text())
        assert s["status"] == "finished" and s["steps"] == 4 and math.isfinite(s["metrics"]["val_acc"])
        assert s["method"] == s["patch"]["method"] == s["config"]["conditioning"]["method"] == m
        parts = m.split("+")
        assert {c.split(":")[0] for c in s["patch"]["counts"]} <= set(parts) and s["patch"]["counts"], s["patch"]
        assert s["code"]["conditioning"] == code_fingerprint(m)["conditioning"]  # the method's own provenance
        assert "entropy/l0" in s["diagnostics"]["step0"], m  # read from the attention it computes


def _train(tmp: Path, *extra: str) -> dict:
    from condattn.engine.trainer import train
    from condattn.train import _names, check

    o = overrides(tmp, *extra)
    assert check(o) == []
    cfg = compose(o)
    cfg.run.name = _names[frozenset(o)]  # the CLI's name, variant suffix included
    return train(cfg)


def _weights(s: dict) -> dict:
    return load_file(str(Path(s["run_dir"]) / "checkpoints" / "step_0000004" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("method", RIVALS)
def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path, method):
    from condattn.engine.trainer import TrainingInterrupted

    extra = ["conditioning.qk_clip_tau=0.001"] if method == "qk_clip" else []  # (a τ that clips at every step)
    ref = _train(tmp_path / "a", f"conditioning={method}", *extra)
    with pytest.raises(TrainingInterrupted):
        _train(tmp_path / "b", f"conditioning={method}", *extra, "debug.interrupt_at_step=2")
    resumed = _train(tmp_path / "b", f"conditioning={method}", *extra)
    assert resumed["launch"]["resumed_at_steps"] == [2] and resumed["metrics"] == ref["metrics"]
    wa, wb = _weights(ref), _weights(resumed)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_option_overrides_name_their_runs_and_act(tmp_path):
    from condattn.train import _names, check

    def name(*extra: str) -> str:
        o = overrides(tmp_path, *extra)
        assert check(o) == []
        return _names[frozenset(o)]

    for method, option in (("gated_attention", "gate=headwise"), ("softcap", "softcap_cap=30"),
                           ("qk_clip", "qk_clip_tau=50"), ("qk_norm+spectral", "lam=2")):
        assert name(f"conditioning={method}", f"conditioning.{option}") != name(f"conditioning={method}"), option
    assert name("conditioning=softcap", "conditioning.softcap_cap=50") == name("conditioning=softcap")
    head = _train(tmp_path, "conditioning=gated_attention", "conditioning.gate=headwise")
    assert head["patch"]["options"] == {"gate": "headwise"}
    gates = {k: v.shape for k, v in _weights(head).items() if "gate" in k}
    assert gates and all(s[0] == 2 for s in gates.values())  # one gate per head (2 heads)
    # QK-clip acts through the trainer's per-step call: below every logit it rescales W_Q / W_K; at Kimi K2's τ the
    # smoke ViT's logits (|s| < 1 at init) never reach it, and the run is the baseline's to the bit
    base, kimi = _train(tmp_path, "conditioning=none"), _train(tmp_path, "conditioning=qk_clip")
    low = _train(tmp_path, "conditioning=qk_clip", "conditioning.qk_clip_tau=0.001")
    assert kimi["metrics"] == base["metrics"] and low["patch"]["options"]["qk_clip_tau"] == 0.001
    wb, wl = _weights(base), _weights(low)
    assert not torch.equal(wb["blocks.0.attn.qkv.weight"], wl["blocks.0.attn.qkv.weight"])


@pytest.mark.slow
def test_a_misspelt_or_foreign_option_is_refused_in_one_line(tmp_path, capsys):
    from condattn.train import cli

    for bad, message in (
        (["conditioning=softcap", "conditioning.softcap_cp=30"],
         "override 'conditioning.softcap_cp=30' names no key of the config; did you mean conditioning.softcap_cap?"),
        (["conditioning=spectral", "conditioning.gate=headwise"],
         "override 'conditioning.gate=headwise' does not apply to conditioning=spectral: it is an option of "
         "gated_attention (output gate); add conditioning=gated_attention, or drop it"),
        (["conditioning=qk_clip", "conditioning.qk_clip_alpha=2"], "conditioning.qk_clip_alpha=2 must be in [0, 1]"),
    ):
        assert cli(overrides(tmp_path, *bad)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"[condattn] {message}"), err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # plans 8 cells, no training: about 8 s
def test_a_table_of_these_methods_plans_every_cell_and_counts_its_cost(tmp_path, capsys):
    """An experiment whose `methods:` lists the rivals and the composites: its dry run plans a cell per method, counts
    each one's FLOPs (a composite is applied by its registered name: qk_norm+spectral applies spectral, then qk_norm)
    and writes nothing."""
    from condattn.reproduce import main

    exp = tmp_path / "rivals_plan.yaml"
    exp.write_text(yaml.safe_dump({"table": "rivals_plan", "metric": "final_val_acc", "methods": ["none", *RIVALS],
                                   "rows": {"vit": {"overrides": ["task=imagenet_vit"]}},
                                   "scales": {"smoke": {"seeds": [0]}}}))
    assert main([str(exp), "--scale", "smoke", "--dry-run", f"paths.runs={tmp_path / 'runs'}",
                 f"paths.results={tmp_path / 'results'}"]) == 0
    out = capsys.readouterr().out
    assert "dry run: 8 of 8 cells would train here" in out and "could not count" not in out, out
    assert all(f"rivals_plan_vit_{m}_smoke_s0 -> " in out for m in RIVALS)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
