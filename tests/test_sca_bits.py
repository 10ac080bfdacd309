"""SCA on the LRA Nyströmformer, bit for bit: a training step (dropout on, the landmark path) of the patched model
equals that of the same model with W + λI written into W_Q, W_K, W_V, and the step-0 diagnostics probe changes
nothing a training step reads (RNG state, train/eval modes, attention settings, the next step's numbers). The smoke
Image SCA cell is chaotic in the last bits (24.67 with 1 thread, 23.00 with 2, other values under another CPU ISA),
so any change of SCA's arithmetic or of what runs before step 1 changes table 4: these tests catch one locally."""

import copy

import torch
from helpers import nystrom_inputs, tiny_nystromformer

import condattn
from condattn.conditioning import find_attention
from condattn.diagnostics import cheap_diagnostics, grad_diagnostics

LAM = 10.0  # the smoke recipe's λ


def step(model, inputs, seed: int = 1) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training forward/backward (dropout drawn from `seed`): the logits and every parameter's gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    logits = model(**inputs)
    torch.nn.functional.cross_entropy(logits, torch.arange(len(logits)) % logits.shape[-1]).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def explicit_sca(model) -> torch.nn.Module:
    """A copy of the unpatched model with λI added by hand to the q/k/v Linears (identity=full, torch (out, in))."""
    twin = copy.deepcopy(model)
    for site in find_attention(twin):
        for role in ("q", "k", "v"):
            lin = site.proj[role].linear
            with torch.no_grad():
                lin.weight += LAM * torch.eye(*lin.weight.shape)
    return twin


def test_sca_training_step_is_w_plus_lambda_i_bit_for_bit():
    model, inputs = tiny_nystromformer(), nystrom_inputs()
    twin = explicit_sca(model)
    rep = condattn.apply_conditioning(model, "spectral", lam=LAM)
    assert rep.counts == {"spectral:hf_separate_qkv": 2}
    (y, g), (y_ref, g_ref) = step(model, inputs), step(twin, inputs)
    assert torch.equal(y, y_ref)
    assert g.keys() == g_ref.keys()
    assert all(torch.equal(g[n], g_ref[n]) for n in g), [n for n in g if not torch.equal(g[n], g_ref[n])]


def test_step0_diagnostics_change_nothing_training_reads():
    model, inputs = tiny_nystromformer(), nystrom_inputs()
    condattn.apply_conditioning(model, "spectral", lam=LAM)
    twin = copy.deepcopy(model)
    model.train()
    modes = [m.training for m in model.modules()]
    attn_impl = model.backbone.config._attn_implementation
    torch.manual_seed(5)
    rng = torch.get_rng_state()
    cheap_diagnostics(model, lambda m, b: m(**b), inputs, mask=inputs["attention_mask"])
    assert torch.equal(torch.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == modes
    assert model.backbone.config._attn_implementation == attn_impl
    (y, g), (y_ref, g_ref) = step(model, inputs), step(twin, inputs)
    assert torch.equal(y, y_ref) and all(torch.equal(g[n], g_ref[n]) for n in g_ref)
    torch.manual_seed(5)
    grad_diagnostics(model)  # read after the first backward, before the optimizer step
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(p.grad, g_ref[n]) for n, p in model.named_parameters() if p.grad is not None)
