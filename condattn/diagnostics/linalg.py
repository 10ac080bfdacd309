"""Condition numbers over the nonzero singular values, computed in float64.

"Nonzero" follows numpy.linalg.matrix_rank: σ counts when σ > max(shape)·eps·σ_max, with eps of the dtype
the matrix was stored in (its entries carry no more precision than that), float32's eps for 16-bit
dtypes (whose eps, ~4e-3 for bf16, times max(shape) would discard every σ below σ_max of a wide matrix).
Pass `rtol` to override.
"""

from __future__ import annotations

import torch


def _eps(dtype: torch.dtype) -> float:
    if not dtype.is_floating_point:
        return torch.finfo(torch.float64).eps
    return min(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)


def _rtol(shape: tuple[int, ...], dtype: torch.dtype, rtol: float | None) -> float:
    return float(rtol) if rtol is not None else max(shape[-2:]) * _eps(dtype)


def singular_values(M: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """The nonzero singular values of a 2-D matrix, descending, float64 (empty for a zero matrix)."""
    if M.dim() != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {tuple(M.shape)}")
    s = torch.linalg.svdvals(M.detach().to(torch.float64))
    if s.numel() == 0 or s[0] <= 0:
        return s[:0]
    return s[s > _rtol(M.shape, M.dtype, rtol) * s[0]]


def condition_number(M: torch.Tensor, rtol: float | None = None) -> float:
    """κ(M) = σ_max / σ_min over the nonzero singular values; nan for a zero matrix."""
    s = singular_values(M, rtol)
    return float(s[0] / s[-1]) if s.numel() else float("nan")


def sigma_min(M: torch.Tensor, rtol: float | None = None) -> float:
    """Smallest nonzero singular value (0.0 for a zero matrix)."""
    s = singular_values(M, rtol)
    return float(s[-1]) if s.numel() else 0.0


def sigma_max(M: torch.Tensor) -> float:
    s = singular_values(M, rtol=0.0)
    return float(s[0]) if s.numel() else 0.0


def batch_condition_numbers(x: torch.Tensor, keep: torch.Tensor | None = None, rtol: float | None = None):
    """Per-matrix κ of a batch x (B, N, D) as a float64 tensor (B,), each over its nonzero singular values.

    keep: (B, N) bool, rows that belong to each matrix (others, e.g. padding, are dropped). Zeroing a row
    leaves the nonzero singular values unchanged, so this is one batched SVD; the tolerance of sample b
    uses its own row count. nan where a matrix is zero.
    """
    if x.dim() != 3:
        raise ValueError(f"expected a batch of matrices (B, N, D), got shape {tuple(x.shape)}")
    xf = x.detach().to(torch.float64)
    n = torch.full((x.shape[0],), x.shape[1], device=x.device)
    if keep is not None:
        keep = keep.to(device=x.device, dtype=torch.bool)
        xf = xf * keep.unsqueeze(-1)
        n = keep.sum(1)
    s = torch.linalg.svdvals(xf)  # (B, min(N, D)), descending
    smax = s[:, 0]
    if rtol is None:
        tol = n.clamp_min(x.shape[2]).to(torch.float64) * _eps(x.dtype)
    else:
        tol = torch.full_like(smax, float(rtol))
    nonzero = s > (tol * smax).unsqueeze(1)
    smin = torch.where(nonzero, s, torch.full_like(s, float("inf"))).amin(1)
    return torch.where(smax > 0, smax / smin, torch.full_like(smax, float("nan")))
