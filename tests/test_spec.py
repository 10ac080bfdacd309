"""ConditioningSpec (conditioning/spec.py): one home for every method's options, defaults, checks and which act; the
run identity hashes only the options that act, and a new method is one registration."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from helpers import mini_listops

import condattn
from condattn.conditioning import spec as S
from condattn.conditioning.spec import MethodSpec, conditioning_spec, register_method
from condattn.config import compose
from condattn.engine.identity import config_hash, options_not_applying, science_config, variant
from condattn.train import _names, check


def tiny_vit():
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                             num_classes=10)


def name_of(overrides: list[str]) -> str:
    assert check(overrides) == []
    return _names[frozenset(overrides)]


# ---------------------------------------------------------------- the run identity hashes the options that act


@pytest.mark.parametrize("inert, active", [
    (["conditioning.correction=svd", "conditioning.lam=3"], ["conditioning.correction=svd"]),
    (["conditioning.correction=svd", "conditioning.lam_unit=sigma_max"], ["conditioning.correction=svd"]),
    (["conditioning.refresh_every=5"], []),  # correction=identity: C = λI is never recomputed
])
@pytest.mark.slow
def test_an_option_that_does_not_act_does_not_rename_the_run(tmp_path, inert, active):
    plain = ["scale=smoke", "logger=none", f"paths.runs={tmp_path}", "conditioning=spectral"]
    assert name_of([*plain, *inert]) == name_of([*plain, *active])
    assert science_config(compose([*plain, *inert])) == science_config(compose([*plain, *active]))


@pytest.mark.slow
def test_options_that_act_still_rename_the_run(tmp_path):
    plain = ["scale=smoke", "logger=none", f"paths.runs={tmp_path}", "conditioning=spectral"]
    svd = [*plain, "conditioning.correction=svd"]
    assert name_of([*plain, "conditioning.lam=3"]) != name_of(plain)  # λ acts on C = λI
    assert name_of([*svd, "conditioning.refresh_every=5"]) != name_of(svd)  # and the refresh on C = σ_max·UVᵀ
    cet = ["scale=smoke", "logger=none", f"paths.runs={tmp_path}", "conditioning=embedded", "conditioning.solver=svd"]
    assert name_of([*cet, "conditioning.ns_iters=2"]) == name_of(cet)  # svd has no Newton–Schulz iterations
    assert name_of([*cet[:-1], "conditioning.ns_iters=2"]) != name_of(cet[:-1])


def test_the_identity_holds_inert_options_at_their_defaults_so_older_hashes_stay():
    """The identity keeps every option of the method (what the run identity always hashed), the inert ones at
    their defaults: a run made before this rule, with its defaults, keeps its hash."""
    svd = conditioning_spec(method="spectral", correction="svd", lam=3, lam_unit="sigma_max")
    assert svd.identity() == conditioning_spec(method="spectral", correction="svd").identity()
    assert set(svd.identity()) == {"method", *S.SPECTRAL_OPTIONS} and svd.identity()["lam"] == 10.0
    assert "lam" not in svd.options and "refresh_every" in svd.options
    cfg = compose(["conditioning=spectral", "conditioning.correction=svd"])
    assert science_config(cfg)["conditioning"] == {**svd.identity(), "targets": ["q", "k", "v"],
                                                   "detr_attention": ["encoder", "decoder_self", "decoder_cross"]}
    assert config_hash(science_config(cfg)) == config_hash(science_config(
        compose(["conditioning=spectral", "conditioning.correction=svd", "conditioning.lam=3"])))


@pytest.mark.slow
def test_after_an_svd_run_the_same_command_with_lam3_finds_it_finished(tmp_path):
    """Issue 24's bug: `conditioning.correction=svd` trained, then the same command with `conditioning.lam=3`
    retrained under another name. Now it is the same run, found finished."""
    from condattn.engine.trainer import train

    def run(*extra: str) -> dict:
        overrides = mini_listops(tmp_path, "conditioning=spectral", "conditioning.correction=svd", *extra)
        cfg = compose(overrides)
        cfg.run.name = name_of(overrides)
        return train(cfg)

    first = run()
    second = run("conditioning.lam=3")
    assert second["run_dir"] == first["run_dir"] and second["metrics"] == first["metrics"]
    assert [d.name for d in (tmp_path / "runs" / "smoke").iterdir() if not d.name.startswith(".")] == \
        [Path(first["run_dir"]).name]  # one run (.locks holds the run locks)


# ---------------------------------------------------------------- checks: the library refuses what the CLI refuses


@pytest.mark.parametrize("lam", [-1, -0.5, float("nan"), float("inf"), "abc"])
def test_apply_conditioning_refuses_a_bad_lambda_in_one_line(lam):
    with pytest.raises(ValueError) as e:
        condattn.apply_conditioning(tiny_vit(), "spectral", lam=lam)
    msg = str(e.value)
    assert msg.startswith(f"conditioning.lam={lam!r} must be ") and "\n" not in msg
    assert ("a number" in msg) if lam == "abc" else ("a finite number ≥ 0" in msg)


def test_lambda_zero_and_integers_are_accepted():
    assert condattn.apply_conditioning(tiny_vit(), "spectral", lam=0).options["lam"] == 0.0
    assert condattn.apply_conditioning(tiny_vit(), "spectral", lam=3).options["lam"] == 3.0


def test_the_spec_is_frozen_and_reads_configs_dicts_and_whole_configs():
    cfg = compose(["conditioning=spectral", "conditioning.lam=2", "conditioning.targets=[q,k]"])
    a, b = conditioning_spec(cfg.conditioning), conditioning_spec(cfg)
    c = conditioning_spec({"method": "spectral", "lam": 2, "targets": "qk"})
    assert a == b == c and a.options["targets"] == ("q", "k") and a["lam"] == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.method = "none"  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.values["lam"] = 1.0  # type: ignore[index]
    assert conditioning_spec(a) is a
    # None takes the default; a spec passed to apply_conditioning is applied as built
    assert conditioning_spec(method="spectral", lam=None)["lam"] == 10.0
    rep = condattn.apply_conditioning(tiny_vit(), c)
    assert rep.method == "spectral" and rep.options == c.on_model(site_kinds=False)


def test_every_yaml_option_is_a_spec_option_with_the_same_default():
    node = compose(["conditioning=spectral"]).conditioning
    yaml = {k: v for k, v in S._plain(node).items() if k != "method"}
    assert set(S.SPECTRAL_OPTIONS) | set(S.EMBEDDED_OPTIONS) <= set(yaml) <= set(S._OPTIONS)
    for key, value in yaml.items():
        default = S.option_default(key)
        assert (list(default) if isinstance(default, tuple) else default) == value, key


# ---------------------------------------------------------------- a new method is one registration


@pytest.fixture
def registry():
    """Registrations made in a test are undone after it."""
    methods, options = dict(S._METHODS), dict(S._OPTIONS)
    yield
    S._METHODS.clear()
    S._METHODS.update(methods)
    S._OPTIONS.clear()
    S._OPTIONS.update(options)


def test_a_registered_method_is_validated_applied_and_named(registry):
    calls = []

    def apply(model, spec, report, partial=False):
        calls.append(spec.options)
        report.notes.append(f"toy eps={spec['toy_eps']}")
        return []

    register_method(MethodSpec("toy", {"toy_eps": 1e-3, "toy_on": "yes"},
                               validators={"toy_eps": S.finite_number(0.0), "toy_on": S.choice(("yes", "no"))},
                               applies=lambda o: {"toy_on", "toy_eps"} if o["toy_on"] == "yes" else {"toy_on"},
                               apply=apply))
    assert "toy" in condattn.conditioning.METHODS and "toy" in list(S.METHODS)
    rep = condattn.apply_conditioning(tiny_vit(), "toy", toy_eps=0.5)
    assert calls == [{"toy_eps": 0.5, "toy_on": "yes"}] and rep.options == calls[0] and rep.notes == ["toy eps=0.5"]
    assert conditioning_spec(method="toy", toy_on="no", toy_eps=2).identity() == \
        {"method": "toy", "toy_eps": 1e-3, "toy_on": "no"}
    with pytest.raises(ValueError, match=r"conditioning.toy_eps=-1 must be a finite number ≥ 0"):
        conditioning_spec(method="toy", toy_eps=-1)
    with pytest.raises(ValueError, match=r"toy_on='maybe' is invalid; choose one of \['yes', 'no'\]"):
        conditioning_spec(method="spectral", toy_on="maybe")  # every given option is checked, whoever owns it
    # a composite is the union of its parts, and the old methods do not take the new option
    register_method(S.composite("spectral+toy", "spectral", "toy"))
    both = conditioning_spec(method="spectral+toy", correction="svd", lam=3)
    assert "toy_eps" in both.options and "lam" not in both.options and both.parts == ("spectral", "toy")
    cfg = compose(["conditioning=spectral"])
    assert options_not_applying(cfg, ["conditioning.toy_eps=1"]) == [
        "override 'conditioning.toy_eps=1' does not apply to conditioning=spectral: it is an option of toy; add "
        "conditioning=toy (or spectral+toy), or drop it"]


def test_one_option_name_means_one_option(registry):
    with pytest.raises(ValueError, match="already registered"):
        register_method(MethodSpec("spectral"))
    with pytest.raises(ValueError, match="'lam' has default 5"):
        register_method(MethodSpec("other", {"lam": 5.0}))
    shared = register_method(MethodSpec("other", {"lam": 10.0}))  # SCA's λ, shared with its check
    with pytest.raises(ValueError, match="finite number"):
        conditioning_spec(method=shared.name, lam=math.nan)


def test_variant_of_an_unknown_method_keeps_what_was_given():
    cfg = compose(["conditioning=spectral"])
    cfg.conditioning.method = "nope"
    assert science_config(cfg)["conditioning"]["method"] == "nope" and variant(cfg, None)
    with pytest.raises(ValueError, match="valid methods: none, spectral, embedded, spectral\\+embedded"):
        conditioning_spec(cfg)


# ---------------------------------------------------------------- the config is checked once per CLI run




@pytest.fixture
def config_checks(monkeypatch):
    """Counts the config checks (engine/preflight.check_config: every caller goes through it) and Budget builds."""
    from condattn.engine import budget, preflight

    counts = {"check_config": 0, "Budget": 0}
    check, init = preflight.check_config, budget.Budget.__init__

    def counted_check(cfg):
        counts["check_config"] += 1
        return check(cfg)

    def counted_init(self, *a, **k):
        counts["Budget"] += 1
        init(self, *a, **k)

    monkeypatch.setattr(preflight, "check_config", counted_check)
    monkeypatch.setattr(budget.Budget, "__init__", counted_init)
    return counts


@pytest.mark.slow
def test_reproduce_dry_run_checks_each_cell_once(tmp_path, config_checks, capsys):
    import yaml
    from helpers import experiment_raw

    from condattn.reproduce import main

    exp = experiment_raw("table4_lra")
    exp["rows"] = {"listops": exp["rows"]["listops"]}
    path = tmp_path / "table4_lra.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    assert main([str(path), "--seeds", "0", "--dry-run", "logger=none", f"paths.runs={tmp_path / 'runs'}",
                 f"paths.results={tmp_path / 'results'}"]) == 0
    assert "3 of 3 cells would train here" in capsys.readouterr().out
    assert config_checks == {"check_config": 3, "Budget": 3}


@pytest.mark.slow
def test_one_train_cli_run_checks_its_config_once(tmp_path, config_checks, monkeypatch, capsys):
    """`python -m condattn.train ...` as its __main__ runs it, in this process: the CLI's preflight checks the
    config, the trainer and engine/setup.py take its Checked (the spec and the Budget) and check nothing again."""
    import sys

    from condattn import train as cli_module

    overrides = mini_listops(tmp_path, "conditioning=spectral")
    assert cli_module.cli(overrides) is None
    assert config_checks == {"check_config": 1, "Budget": 1}
    monkeypatch.setattr(sys, "argv", ["condattn.train", *overrides])
    cli_module.main()
    assert "steps=4" in capsys.readouterr().out
    assert config_checks == {"check_config": 1, "Budget": 1}
    # the library's own entry point checks once too
    from condattn.engine.trainer import train

    train(compose(mini_listops(tmp_path, "conditioning=embedded", "run.name=lib")))
    assert config_checks == {"check_config": 2, "Budget": 2}
