"""What a new user of the method library meets first (issue 50): options of another method and numbers given as
strings refused in one line; remove_conditioning's refusal on init-only methods telling what happened; κ(J) on a
channels-first attention (EfficientViT-MSRA), unpatched and patched, and σReparam's convolutions still found by the
diagnostics. (A plain transformers load of a conditioned checkpoint: tests/test_save_load.py.)"""

from __future__ import annotations

import pytest
import torch

import condattn

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.compat]


def _encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2,
                                       enable_nested_tensor=False).eval()


def _refused(model, method, **options) -> str:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as err:
        condattn.apply_conditioning(model, method, **options)
    assert "\n" not in str(err.value) and condattn.conditioning_report(model) is None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    return str(err.value)


@pytest.mark.parametrize(("method", "option", "owner"), [("embedded", "lam", "spectral"),
                                                         ("spectral", "solver", "embedded"),
                                                         ("qk_norm", "targets", "spectral")])
def test_an_option_of_another_method_is_refused(method, option, owner):
    value = {"lam": 3, "solver": "svd", "targets": "qk"}[option]
    msg = _refused(_encoder(), method, **{option: value})
    assert f"{option}={value!r}" in msg and f"method {method!r}" in msg and owner in msg


def test_a_permission_is_accepted_with_any_method():
    """CET's causal_leak permits rather than changes: granting it where nothing needs it changes nothing."""
    assert condattn.apply_conditioning(_encoder(), "spectral", lam=2, causal_leak="accept").method == "spectral"


@pytest.mark.parametrize(("method", "options"), [("spectral", {"lam": "10"}), ("embedded", {"ns_iters": "3"}),
                                                 ("spectral", {"refresh_every": "2", "correction": "svd"})])
def test_a_number_given_as_a_string_is_refused(method, options):
    msg = _refused(_encoder(), method, **options)
    key, value = next(iter(options.items()))
    assert f"{key}={value!r} must be" in msg and msg.endswith("not a string")


@pytest.mark.parametrize("method", ["mimetic_init", "conditioned_init"])
def test_remove_after_an_init_only_method_says_what_happened(method):
    model = _encoder()
    condattn.apply_conditioning(model, method)
    with pytest.raises(RuntimeError) as err:
        condattn.remove_conditioning(model)
    msg = str(err.value)
    assert "\n" not in msg and "training" not in msg and "set the weights' values once" in msg and method in msg
    assert condattn.conditioning_report(model).method == method  # still recorded: nothing was undone


def _efficientvit():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("efficientvit_m0", pretrained=False, num_classes=10, img_size=64).eval()


@pytest.mark.slow  # about 6 s: three EfficientViT-MSRA models and an exact κ(J) each
@pytest.mark.parametrize("method", [None, "spectral", "sigma_reparam"])
def test_jacobian_kappa_reads_efficientvit_msra_channels_first(method):
    """Head 0 of the first cascaded group attention reads its channel chunk of a (B, C, H, W) map: X is that chunk's
    H·W tokens, D its channels (efficientvit_m0 at 64 px: a 4 × 4 map after the stem's 16× stride, 16 tokens)."""
    from condattn.diagnostics import jacobian_kappa

    model = _efficientvit()
    if method:
        condattn.apply_conditioning(model, method)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    res = jacobian_kappa(model, lambda m, b: m(b), x)
    attn = model.stages[0].blocks[0].mixer.m.attn
    d = attn.key_dim
    assert res["layer"].endswith("#h0") and res["tokens"] == 16
    assert res["J_shape"] == [16 * d, 3 * (attn.qkvs[0].conv.in_channels) * d]
    assert torch.isfinite(torch.tensor(res["kappa"])) and res["kappa"] >= 1


def test_cheap_diagnostics_after_sigma_reparam_keeps_every_key():
    """σReparam swaps each 1×1 conv for its reparametrised one; the layout still finds the sites, so the diagnostics
    read every layer, as on the unpatched model."""
    from condattn.diagnostics import cheap_diagnostics

    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    plain = cheap_diagnostics(_efficientvit(), lambda m, b: m(b), x)["flat"]
    model = _efficientvit()
    condattn.apply_conditioning(model, "sigma_reparam")
    patched = cheap_diagnostics(model, lambda m, b: m(b), x)["flat"]
    assert len(plain) > 100 and set(patched) == set(plain)


def test_the_core_install_needs_only_torch():
    """pyproject.toml: the library's one dependency is torch (a range); timm, transformers and the harness are
    extras; the harness's exact releases are in constraints.txt, which `make install` uses."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert [d.split(">")[0].split("=")[0].strip() for d in project["dependencies"]] == ["torch"]
    assert "==" not in project["dependencies"][0]
    extras = project["optional-dependencies"]
    assert {"timm", "transformers", "harness", "dev"} <= set(extras)
    pins = dict(line.split("==") for line in (root / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert {"torch", "timm", "transformers", "hydra-core", "accelerate"} <= set(pins)
    assert "-c constraints.txt" in (root / "Makefile").read_text()


@pytest.mark.slow  # a fresh interpreter
def test_import_condattn_loads_no_optional_package():
    """`import condattn` (and its conditioning and diagnostics) with timm, transformers and every harness package
    made unimportable: only torch is needed."""
    import subprocess
    import sys

    blocked = ["timm", "transformers", "safetensors", "hydra", "omegaconf", "accelerate", "wandb", "datasets",
               "torchvision", "matplotlib", "pandas", "scipy", "sklearn", "yaml"]
    code = ("import sys\n"
            f"for name in {blocked!r}:\n    sys.modules[name] = None\n"
            "import condattn, condattn.conditioning, condattn.diagnostics\n"
            "m = __import__('torch').nn.TransformerEncoder(__import__('torch').nn.TransformerEncoderLayer(16, 2, 32, "
            "batch_first=True), 2, enable_nested_tensor=False)\n"
            "print(condattn.apply_conditioning(m, 'spectral', lam=2.0).counts)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "{'spectral:torch_mha': 2}"
