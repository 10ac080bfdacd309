"""CET (Saratchandran & Lucey, ICCV 2025): X <- X + σ_1(X)·U V^T for each sample's token matrix X.

With the thin SVD X = U Σ V^T, X + C = U (Σ + σ_1 I) V^T, so κ(X + C) = 2σ_1 / (σ_1 + σ_r) ≤ 2.
U V^T is the orthogonal polar factor of X; the `newton_schulz` solver approximates it with matmuls only.
Rows excluded by the mask (padding, and prefix tokens when tokens=patches_only) enter neither the SVD nor
the correction: they leave the hook exactly as they came in.
"""

from __future__ import annotations

import torch
from torch import nn

from .sites import TokenSite
from .tokens import as_tokens, call_mask, from_tokens

POSITIONS = ("after_pos_embed", "before_pos_embed")
TOKENS = ("all", "patches_only")
GRADIENTS = ("detach", "through")
SOLVERS = ("svd", "newton_schulz")
CAUSAL_LEAK = ("refuse", "accept")  # on a causal decoder: refuse (default), or accept the look-ahead of the SVD
SCALES = ("keep", "norm")  # keep: the paper's X + C; norm: X + C rescaled to ‖X‖_F per sample (κ unchanged)


def _svd_polar(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    return s[..., :1, None], u @ vh


# Quintic a·s + b·s³ + c·s⁵ with slope 3.44 at 0 (Keller Jordan's Muon coefficients): lifts tiny singular values
# fast into roughly [0.7, 1.2] but does not converge to 1; the cubic Newton–Schulz steps after it do.
LIFT = (3.4445, -4.7750, 2.0315)


def _ns_polar(
    x: torch.Tensor, keep: torch.Tensor | None, ns_iters: int, power_iters: int, lift_iters: int = 8,
    eps: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """σ_1 by power iteration on the smaller Gram matrix, then the polar factor by matmuls only:
    `lift_iters` quintic steps, then `ns_iters` cubic Newton–Schulz steps Y <- 1.5 Y - 0.5 Y Y^T Y, started
    at X / σ_1 (singular values in (0, 1], inside the cubic iteration's (0, √3) basin).

    Newton–Schulz only multiplies small singular values, so an exact or near null direction of X
    (LayerNorm'd tokens at init: every row sums to zero) would never reach 1 and κ(X + C) would stay huge,
    where the exact SVD fills it with σ_1. So the iteration runs on X + ε·σ_1·I_{N×D} (masked rows kept
    at zero), at an O(ε) change of C. A null direction then starts at ε times the part of I_{N×D}'s column
    outside X's column space, which can be far below ε when padding leaves about as many rows as channels
    (with 6 lift steps: 30 of 400 padded ListOps token matrices ended at κ > 2.05, up to 162; with 8: 4).
    `polar_correction` therefore checks every sample's result (‖P‖_F² must equal its rank) and recomputes
    the rare failures with the exact SVD, so the bound holds whatever the spectrum.
    """
    tall = x.shape[-2] >= x.shape[-1]
    gram = x.mT @ x if tall else x @ x.mT
    # not the all-ones start: LayerNorm'd tokens have it as an exact null direction (X·1 = 0), where power
    # iteration would crawl out on rounding noise and under-estimate σ_1 (found: 18.4 vs 20.3, κ 2.1)
    j = torch.arange(gram.shape[-1], dtype=x.dtype, device=x.device)
    v = (1.0 + 0.5 * torch.cos(0.7 * j + 0.3)).expand(*gram.shape[:-1]).unsqueeze(-1)
    for _ in range(power_iters):
        v = gram @ v
        v = v / v.norm(dim=-2, keepdim=True).clamp_min(1e-30)
    sigma = (v.mT @ gram @ v).clamp_min(0).sqrt()  # Rayleigh quotient, (B, 1, 1)
    eye = torch.eye(x.shape[-2], x.shape[-1], dtype=x.dtype, device=x.device)
    if keep is not None:
        eye = eye * keep.unsqueeze(-1)
    y = (x + eps * sigma * eye) / (sigma * (1.0 + eps) * 1.001).clamp_min(1e-30)
    a, b, c = LIFT
    for _ in range(lift_iters):
        m = y.mT @ y if tall else y @ y.mT
        poly = b * m + c * (m @ m)
        poly.diagonal(dim1=-2, dim2=-1).add_(a)
        y = y @ poly if tall else poly @ y
    for _ in range(ns_iters):
        y = 1.5 * y - 0.5 * (y @ (y.mT @ y) if tall else (y @ y.mT) @ y)
    return sigma, y


def _exact_where_unconverged(
    xf: torch.Tensor, keep: torch.Tensor | None, sigma: torch.Tensor, polar: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Newton–Schulz leaves a singular value of the polar factor P well below 1 only for a (near-)null
    direction it could not lift (see `_ns_polar`). Every singular value of a converged P is 1, so
    ‖P‖_F² = min(rows kept, D); a sample off by more than 0.05 (some singular value below ~0.97) gets
    the exact SVD on its kept rows instead. One host sync per call; rare fallbacks (measured: 1% of
    padded ListOps samples, none on unpadded ViT/BERT tokens)."""
    n_rows = keep.sum(1) if keep is not None else torch.full(xf.shape[:1], xf.shape[-2], device=xf.device)
    rank = n_rows.clamp(max=xf.shape[-1]).to(polar.dtype)
    # `not <=` also catches a NaN/inf polar factor (an under-estimated σ_1 pushes singular values out of the
    # iteration's basin); samples whose tokens are themselves non-finite are left for the loss check to report
    off = ((polar * polar).sum((-2, -1)) - rank).abs()
    bad = ~(off <= 0.05) & torch.isfinite(xf).all(dim=-1).all(dim=-1)
    if torch.compiler.is_compiling():  # torch.compile / torch.export: no host branch, the same choice as a graph op
        return _traced_fallback(xf, keep, sigma, polar, bad)
    if not bool(bad.any()):
        return sigma, polar
    sigma, polar = sigma.clone(), polar.clone()
    for b in torch.nonzero(bad).squeeze(1).tolist():
        rows = keep[b] if keep is not None else slice(None)
        s, p = _svd_polar(xf[b, rows])
        sigma[b] = s
        polar[b] = 0
        polar[b, rows] = p
    return sigma, polar


def _traced_fallback(xf, keep, sigma, polar, bad) -> tuple[torch.Tensor, torch.Tensor]:
    """`_exact_where_unconverged` for compiled / exported graphs: torch.cond on any sample not converging runs one
    batched exact SVD and takes it where `bad`. A padded sample's SVD then runs on its zeroed rows and is masked:
    the same polar factor as the eager path's SVD of its kept rows whenever those rows have full rank."""
    def exact(xf, sigma, polar, bad, *keep):
        s, p = _svd_polar(torch.where(bad[:, None, None], xf, 0.0))  # a non-finite sample (never bad) must not reach it
        if keep:
            p = p * keep[0].unsqueeze(-1)
        sel = bad[:, None, None]
        return torch.where(sel, s.to(sigma.dtype), sigma), torch.where(sel, p.to(polar.dtype), polar)

    def converged(xf, sigma, polar, bad, *keep):
        return sigma.clone(), polar.clone()

    operands = (xf, sigma, polar, bad) + (() if keep is None else (keep,))
    return tuple(torch.cond(bad.any(), exact, converged, operands))


def polar_correction(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    solver: str = "svd",
    gradient: str = "detach",
    ns_iters: int = 4,
    power_iters: int = 20,
    lift_iters: int = 8,
    scale: str = "keep",
) -> torch.Tensor:
    """Return X + σ_1(X)·U V^T per sample for tokens x of shape (B, N, D).

    mask: (B, N) bool, True for rows that take part; other rows are returned unchanged.
    scale: `keep` (the paper's formula) or `norm`: the corrected rows rescaled by ‖X‖_F / ‖X + C‖_F over the rows
    that take part (per sample), so the first block sees tokens of the original size (X + C has ‖C‖_F ≈ 12‖X‖_F on
    ViT-B's raw patch embeddings) with the same κ. The factor follows `gradient` (a constant under detach).
    Computed in fp32 with autocast off (an SVD in bf16 is not meaningful), then cast back to x.dtype.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not one of {SCALES}")
    out = _polar_correction(x, mask, solver, gradient, ns_iters, power_iters, lift_iters)
    if scale == "keep":
        return out
    keep = None if mask is None else mask.to(device=x.device, dtype=torch.bool).unsqueeze(-1)
    with torch.autocast(device_type=x.device.type, enabled=False), torch.set_grad_enabled(
        gradient == "through" and torch.is_grad_enabled()
    ):
        xs, os_ = (x.detach(), out.detach()) if gradient == "detach" else (x, out)
        xs, os_ = xs.float(), os_.float()
        if keep is not None:
            xs, os_ = xs * keep, os_ * keep
        factor = xs.norm(dim=(-2, -1), keepdim=True) / os_.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-30)
        if keep is not None:
            factor = torch.where(keep, factor, torch.ones_like(factor))
    return out * factor.to(out.dtype)


def _polar_correction(x, mask, solver, gradient, ns_iters, power_iters, lift_iters) -> torch.Tensor:
    if x.dim() != 3:
        raise ValueError(f"expected tokens of shape (B, N, D), got {tuple(x.shape)}")
    keep = None if mask is None else mask.to(device=x.device, dtype=torch.bool)
    if keep is not None and not torch.compiler.is_compiling() and keep.all():  # all-True: the same numbers
        keep = None
    with torch.autocast(device_type=x.device.type, enabled=False), torch.set_grad_enabled(
        gradient == "through" and torch.is_grad_enabled()
    ):
        xf = (x.detach() if gradient == "detach" else x).to(torch.promote_types(x.dtype, torch.float32))
        if keep is not None:
            xf = xf * keep.unsqueeze(-1)
        if solver == "newton_schulz":
            sigma, polar = _ns_polar(xf, keep, ns_iters, power_iters, lift_iters)
            sigma, polar = _exact_where_unconverged(xf, keep, sigma, polar)
        elif solver == "svd":
            if keep is not None and gradient == "through":
                # per sample on its valid rows only: zero rows would give repeated zero singular values,
                # whose SVD backward is undefined
                corr = torch.zeros_like(xf)
                for b in range(xf.shape[0]):
                    rows = keep[b]
                    if rows.any():
                        s, p = _svd_polar(xf[b, rows])
                        corr[b, rows] = s * p
                return x + corr.to(x.dtype)
            sigma, polar = _svd_polar(xf)
        else:
            raise ValueError(f"solver={solver!r} is not one of {SOLVERS}")
        corr = sigma * polar
        if keep is not None:
            corr = corr * keep.unsqueeze(-1)
    return x + corr.to(x.dtype)


class EmbeddedTokens:
    """Hooks that apply `polar_correction` at one TokenSite and track the padding mask."""

    def __init__(self, site: TokenSite, position: str, tokens: str, **solver_opts):
        self.site, self.position, self.tokens, self.solver_opts = site, position, tokens, solver_opts
        self.padding_mask: torch.Tensor | None = None

    def attach(self) -> list[torch.utils.hooks.RemovableHandle]:
        handles = []
        if self.site.mask_owner is not None:
            handles.append(self.site.mask_owner.register_forward_pre_hook(self._capture_mask, with_kwargs=True))
        if self.position == "after_pos_embed" or self.site.embed is None:  # None: no positions on the tokens (DETR)
            handles.append(self.site.first_block.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
        else:
            handles.append(self.site.embed.register_forward_hook(self._post_hook))
        return handles

    def _capture_mask(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.padding_mask = call_mask(self.site, args, kwargs)

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict):
        if args:
            return (self.correct(args[0]), *args[1:]), kwargs
        key = "hidden_states" if "hidden_states" in kwargs else "x"
        return args, {**kwargs, key: self.correct(kwargs[key])}

    def _post_hook(self, module: nn.Module, args: tuple, output):
        if isinstance(output, tuple):  # XCiT's patch embedding returns (tokens, (Hp, Wp))
            return (self.correct(output[0]), *output[1:])
        return self.correct(output)

    def correct(self, x: torch.Tensor) -> torch.Tensor:
        """X + C for a block input x: (B, N, D), or a 4-D map read as its (H·W) × C token matrix (Swin's (B, H, W, C),
        DaViT's channels-first (B, C, H, W): TokenSite.channels_first)."""
        prefix = self.site.num_prefix_tokens if self.position == "after_pos_embed" else 0
        skip = prefix if self.tokens == "patches_only" else 0
        if self.site.sequence_first:  # (N, B, D): each sample's token matrix is x[:, b]
            return corrected_tokens(x.transpose(0, 1), self.padding_mask, skip, False, self.site.first_block_name,
                                    **self.solver_opts).transpose(0, 1)
        return corrected_tokens(x, self.padding_mask, skip, self.site.channels_first, self.site.first_block_name,
                                **self.solver_opts)


@torch.fx.wrap  # one leaf call in a torch.fx graph, run eagerly there: its shape checks and solver branches stay
def corrected_tokens(x: torch.Tensor, padding_mask: torch.Tensor | None, skip: int, channels_first: bool,
                     where: str, **solver_opts) -> torch.Tensor:
    """`polar_correction` of a block input x (B, N, D), or of a 4-D map read as its (H·W) × C token matrix; rows
    outside `padding_mask` (B, N) and the first `skip` (prefix) tokens take no part."""
    t = as_tokens(x, channels_first) if x.dim() == 4 else x
    batch, n = t.shape[0], t.shape[1]
    mask = None
    if padding_mask is not None:
        if padding_mask.shape != (batch, n):
            raise RuntimeError(f"CET: padding mask of shape {tuple(padding_mask.shape)} does not match the {n} "
                               f"tokens of a batch of {batch} at {where}")
        mask = padding_mask.to(device=t.device, dtype=torch.bool)
    if skip:
        mask = torch.ones(batch, n, dtype=torch.bool, device=t.device) if mask is None else mask.clone()
        mask[:, :skip] = False
    return from_tokens(polar_correction(t, mask, **solver_opts), x.shape, channels_first)
