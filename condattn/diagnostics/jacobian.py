"""κ(J) of one softmax attention head with respect to its parameters (W_Q, W_K, W_V), the SCA bound's
left-hand side.

    f(W_Q, W_K, W_V) = softmax(X W_Q W_K^T X^T · scale) X W_V,   X (N, D), W_* (D, d) (paper layout)

J = ∂vec(f) / ∂(vec W_Q, vec W_K, vec W_V) has shape (N·d, 3·D·d); κ(J) is taken over its nonzero
singular values. Exact: torch.func.jacrev + an SVD, in float64 (small sizes). Matrix-free: Lanczos on
J J^T with products through torch.func.vjp / jvp (full-size layers).

Every function takes an optional `head`: any function (X, W_q, W_k, W_v) -> (N, d) of the same shapes, e.g.
`functools.partial(xca_head, temperature=τ)` for XCiT's cross-covariance attention (an attention site's own head
function: `site.form.head(site, h)`, conditioning/forms.py). The default (None) is `attention_head` with `scale`,
i.e. the token softmax head above. For the κ(J) of a model's layer see layer_jacobian.py.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from ..conditioning.forms import HeadFn, attention_head, xca_head  # noqa: F401  (xca_head: re-exported)
from .linalg import singular_values


def _head_fn(head: HeadFn | None, scale: float | None) -> HeadFn:
    """The head function (X, W_q, W_k, W_v) -> (N, d) the Jacobian is taken of."""
    if head is None:
        return lambda X, wq, wk, wv: attention_head(X, wq, wk, wv, scale)
    if scale is not None:
        raise ValueError("scale applies to the default attention_head only; bind it into `head` instead")
    return head


def _setup(X, W_q, W_k, W_v):
    X = torch.as_tensor(X).detach().to(torch.float64)
    params = tuple(torch.as_tensor(w).detach().to(device=X.device, dtype=torch.float64) for w in (W_q, W_k, W_v))
    if X.dim() != 2 or any(w.dim() != 2 or w.shape[0] != X.shape[1] for w in params):
        raise ValueError(
            f"expected X (N, D) and W_q, W_k, W_v (D, d); got X {tuple(X.shape)}, W {[tuple(w.shape) for w in params]}"
        )
    if len({w.shape for w in params}) != 1:
        raise ValueError(f"W_q, W_k, W_v must have the same shape, got {[tuple(w.shape) for w in params]}")
    return X, params


def attention_jacobian(X, W_q, W_k, W_v, scale: float | None = None, head: HeadFn | None = None) -> torch.Tensor:
    """The explicit J, float64, shape (N·d, 3·D·d); columns: vec(W_q), vec(W_k), vec(W_v), row-major.
    head: the head function (default: attention_head with `scale`)."""
    fn = _head_fn(head, scale)
    X, params = _setup(X, W_q, W_k, W_v)
    sizes = [w.numel() for w in params]
    shape = params[0].shape

    def f(flat):
        wq, wk, wv = (p.reshape(shape) for p in flat.split(sizes))
        return fn(X, wq, wk, wv).reshape(-1)

    return torch.func.jacrev(f)(torch.cat([w.reshape(-1) for w in params]))


def jacobian_singular_values(X, W_q, W_k, W_v, scale: float | None = None,
                             head: HeadFn | None = None) -> torch.Tensor:
    """Nonzero singular values of J, descending (float64 SVD; nonzero: > max(shape)·eps64·σ_max)."""
    return singular_values(attention_jacobian(X, W_q, W_k, W_v, scale, head))


def jacobian_condition_number(X, W_q, W_k, W_v, scale: float | None = None, head: HeadFn | None = None) -> float:
    """Exact κ(J) = σ_max / σ_min over the nonzero singular values of J (jacrev + SVD, float64)."""
    s = jacobian_singular_values(X, W_q, W_k, W_v, scale, head)
    return float(s[0] / s[-1]) if s.numel() else float("nan")


def lanczos_extremes(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    *,
    iters: int = 300,
    tol: float = 1e-6,
    seed: int = 0,
    device: torch.device | str = "cpu",
    check_every: int = 5,
) -> dict:
    """Smallest and largest eigenvalue of a symmetric positive semi-definite operator of size n by Lanczos
    with full reorthogonalisation (float64). Stops when both extreme Ritz pairs have residual
    ‖A y − θ y‖ ≤ tol·θ, after `iters` steps, or when the Krylov space is exhausted (exact then).
    Returns {"lam_min", "lam_max", "iterations", "converged", "residual_min", "residual_max"}."""
    g = torch.Generator().manual_seed(seed)
    m = min(iters, n)
    Q = torch.zeros(m, n, dtype=torch.float64, device=device)
    q = torch.randn(n, generator=g, dtype=torch.float64).to(device)
    Q[0] = q / q.norm()
    alpha: list[float] = []
    beta: list[float] = []
    for j in range(m):
        w = matvec(Q[j])
        alpha.append(float(w @ Q[j]))
        w = w - alpha[-1] * Q[j] - (beta[-1] * Q[j - 1] if j else 0.0)
        for _ in range(2):
            w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        b = float(w.norm())
        last = j + 1 == m
        if last or b == 0.0 or (j + 1) % check_every == 0:
            T = torch.diag(torch.tensor(alpha, dtype=torch.float64))
            if beta:
                off = torch.tensor(beta, dtype=torch.float64)
                T += torch.diag(off, 1) + torch.diag(off, -1)
            theta, S = torch.linalg.eigh(T)
            res = b * S[-1].abs()
            lo, hi = float(theta[0]), float(theta[-1])
            exhausted = j + 1 == n or b <= 1e-14 * abs(hi)
            converged = exhausted or (res[0] <= tol * abs(lo) and res[-1] <= tol * abs(hi))
            if converged or last:
                return {
                    "lam_min": lo,
                    "lam_max": hi,
                    "iterations": j + 1,
                    "converged": bool(converged),
                    "residual_min": float(res[0]),
                    "residual_max": float(res[-1]),
                }
        beta.append(b)
        Q[j + 1] = w / b
    raise AssertionError("unreachable")


def jacobian_condition_number_matfree(
    X,
    W_q,
    W_k,
    W_v,
    scale: float | None = None,
    iters: int = 300,
    tol: float = 1e-6,
    seed: int = 0,
    return_info: bool = False,
    head: HeadFn | None = None,
):
    """κ(J) without forming J: sqrt(λ_max / λ_min) of J J^T, both extremes by Lanczos, each product
    J J^T v = jvp(f, J^T v) with J^T v = vjp(f)(v). Float64.

    Why J J^T and not J^T J: J is (N·d) × (3·D·d) and wide. J^T J (3·D·d square) is always singular: it
    has at least 3·D·d − N·d zero eigenvalues, plus the exact symmetries of f (W_Q A, W_K A^{-T} leave
    W_Q W_K^T unchanged; softmax ignores a shift of each logit row), so an eigen-solver's smallest
    eigenvalue there is 0, not σ_min(J)², and deflating that null space is not cheap. J J^T (N·d square)
    has exactly the nonzero σ(J)² as eigenvalues and is normally full rank (whenever P X has full row
    rank, P the softmax matrix, e.g. N ≤ D: the W_V block alone is P X ⊗ I_d), and it is the smaller one.
    If J J^T is numerically singular (J not of full row rank, possible when N > D) the nonzero σ_min
    cannot be found this way: a warning is issued and inf returned; use the exact function.

    iters bounds the Lanczos steps (each one vjp + one jvp); with iters ≥ N·d the answer is exact up to
    rounding. return_info=True returns (κ, info dict with sigma_min, sigma_max, iterations, converged).
    head: the head function (default: attention_head with `scale`). The rank argument above holds for
    xca_head too: its W_V block maps dW_v to X dW_v Aᵀ, of full row rank N·d when X has full row rank
    (N ≤ D) and the d × d softmax matrix A is nonsingular.
    """
    fn = _head_fn(head, scale)
    X, params = _setup(X, W_q, W_k, W_v)

    def f(wq, wk, wv):
        return fn(X, wq, wk, wv).reshape(-1)

    out, vjp_fn = torch.func.vjp(f, *params)

    def matvec(v: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(f, params, vjp_fn(v))[1]

    n = out.numel()
    info = lanczos_extremes(matvec, n, iters=iters, tol=tol, seed=seed, device=X.device)
    lo, hi = info["lam_min"], info["lam_max"]
    if hi <= 0:
        kappa = float("nan")
    elif lo <= n * torch.finfo(torch.float64).eps * hi:
        warnings.warn(
            "J J^T is numerically singular (J lacks full row rank); the matrix-free κ(J) is not defined "
            "over the nonzero singular values here, use jacobian_condition_number",
            stacklevel=2,
        )
        kappa = float("inf")
    else:
        kappa = math.sqrt(hi / lo)
    if not info["converged"]:
        warnings.warn(f"Lanczos did not converge in {iters} steps; κ(J) is a lower estimate", stacklevel=2)
    info.update(sigma_min=math.sqrt(max(lo, 0.0)), sigma_max=math.sqrt(max(hi, 0.0)), kappa=kappa)
    return (kappa, info) if return_info else kappa
