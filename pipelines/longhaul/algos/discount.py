"""Turn-Discount's per-token multipliers (pure torch): weights ∝ α^(U−1−u), mean 1 over each row's valid tokens.

Unit `turn`: u is the assistant turn's index, U the number of turns; unit `token`: u is the absolute response
position, U the row's policy tokens (`longhaul.algos.estimators`, step 2). Normalisers are computed in float64 log
space per run (sums of geometric series); token-unit weights are materialised in blocks whose factors both stay in
range (`token_weight_matrix`).
"""

from __future__ import annotations

import math

import torch

from longhaul.algos.runs import Runs, build_runs, paint
from longhaul.algos.settings import DISCOUNT_UNITS


def _row_logsumexp(x: torch.Tensor, row: torch.Tensor, bs: int) -> torch.Tensor:
    """log Σ exp(x) per row for a flat (R,) tensor grouped by `row`; −inf for rows without entries."""
    mx = torch.full((bs,), -math.inf, dtype=torch.float64, device=x.device).scatter_reduce(0, row, x, "amax")
    safe = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    tot = torch.zeros(bs, dtype=torch.float64, device=x.device).index_add_(0, row, torch.exp(x - safe[row]))
    return torch.log(tot) + safe


def _log_geometric(n: torch.Tensor, la: float) -> torch.Tensor:
    """log Σ_{j<n} α^j for n ≥ 1 (float64, stable for any α > 0)."""
    n = n.to(torch.float64)
    if la == 0.0:
        return torch.log(n)
    if la > 0:
        return n * la + torch.log(-torch.expm1(-n * la)) - math.log(math.expm1(la))
    return torch.log(-torch.expm1(n * la)) - math.log(-math.expm1(la))


def turn_weights(runs: Runs, la: float) -> torch.Tensor:
    """Per-run weight ∝ α^(K−1−k), normalised so the mean over the row's valid tokens is 1 (float64, log space)."""
    K = runs.n_turns.to(torch.float64)[runs.row]
    n = (runs.end - runs.start + 1).to(torch.float64)
    logw = (K - 1.0 - runs.k.to(torch.float64)) * la
    logz = _row_logsumexp(logw + torch.log(n), runs.row, runs.L.shape[0])
    return torch.exp(logw - logz[runs.row] + torch.log(runs.L[runs.row]))


def _token_log_offset(runs: Runs, la: float) -> torch.Tensor:
    """Per row c with w_t = exp(c − t·log α) = L·α^(L−1−t) / Σ_valid α^(L−1−s) (float64 log space; 0 for empty
    rows). The normaliser is a sum of per-run geometric series, so no (bs, T) pass is needed."""
    L = runs.L
    mass = (L[runs.row] - 1.0 - runs.end.to(torch.float64)) * la + _log_geometric(runs.end - runs.start + 1, la)
    logz = _row_logsumexp(mass, runs.row, L.shape[0])
    c = torch.log(L.clamp(min=1.0)) + (L - 1.0) * la - logz
    return torch.where(torch.isfinite(c), c, torch.zeros_like(c))


#: Per-token weights are materialised as float32 blocks exp(c − t0·log α) · α^−(t−t0): both factors stay inside
#: float32 range when |log α| · block ≤ this bound (weights below ~1e−38 of the row's largest flush to 0).
_BLOCK_LOG_RANGE = 40.0


def token_weight_matrix(runs: Runs, shape: tuple[int, int], la: float, dtype: torch.dtype) -> torch.Tensor:
    """(bs, T) token-unit weights, exact up to `dtype` rounding; large values only where the mask is 0 and
    clamped there (callers multiply by a row that is 0 on those positions)."""
    bs, T = shape
    dev = runs.L.device
    c = _token_log_offset(runs, la)
    B = T if la == 0.0 else max(1, min(T, int(_BLOCK_LOG_RANGE / abs(la))))
    nb = -(-T // B)
    t0 = torch.arange(nb, dtype=torch.float64, device=dev) * B
    if la >= 0:
        block = (c.unsqueeze(1) - t0.unsqueeze(0) * la).clamp(max=80.0)
        local = torch.exp(-torch.arange(B, dtype=torch.float64, device=dev) * la)
    else:  # anchor each block at its last position so both factors stay bounded
        t1 = t0 + (B - 1)
        block = (c.unsqueeze(1) - t1.unsqueeze(0) * la).clamp(max=80.0)
        local = torch.exp((B - 1 - torch.arange(B, dtype=torch.float64, device=dev)) * la)
    w = torch.exp(block).to(dtype).unsqueeze(2) * local.to(dtype).view(1, 1, B)
    return w.view(bs, nb * B)[:, :T]


def discount_weights(response_mask: torch.Tensor, alpha: float, unit: str) -> torch.Tensor:
    """Weights ∝ α^(U−1−u) over valid tokens, mean 1 over each row's valid tokens, 0 elsewhere (float64)."""
    if unit not in DISCOUNT_UNITS:
        raise ValueError(f"unknown discount unit '{unit}'; valid: {', '.join(DISCOUNT_UNITS)}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (got {alpha})")
    runs = build_runs(response_mask)
    la = math.log(alpha)
    shape = tuple(response_mask.shape)
    if unit == "token":
        ones = paint(torch.ones_like(runs.L[runs.row]), runs, shape, torch.float64)
        return token_weight_matrix(runs, shape, la, torch.float64) * ones
    return paint(turn_weights(runs, la), runs, shape, torch.float64)
