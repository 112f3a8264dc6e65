"""Advantage estimators: GRPO, Turn-Discount, LATA and their combination (method.md b), pure torch.

Inputs are veRL's: `token_level_rewards` (bs, T), `response_mask` (bs, T; 1 = policy token, 0 = prompt-side
tool/user tokens and padding) and a group index (one hashable per row, veRL's `uid`). Outputs are
(advantages, returns), both (bs, T), zero wherever the mask is 0.

Step 1, the group-relative score (as veRL's `grpo`): s_i = Σ_t r_{i,t}; A_i = (s_i − mean_g) / (std_g + ε)
(unbiased std; a singleton group has mean 0 and std 1, exactly like veRL; without `norm_by_std` only the mean
is removed). With ``credit="turn"`` the score of a token in assistant turn k is its turn's return-to-go
G_{i,k} = Σ_{t ≥ start_k} r_{i,t} (see `longhaul.rewards.combine` for the reward layout), normalised with the
same group statistics of s_i; turn 0 therefore gets exactly the trajectory advantage.

Step 2, per-token multipliers:

* ``turn_discount``: w_{i,t} ∝ α^(U_i − 1 − u_{i,t}), normalised to mean 1 over the row's valid tokens.
  unit ``token`` (the original): u = absolute response position t (masked tool/user tokens advance it), U = L_i
  (number of policy tokens). unit ``turn``: u = index of the assistant turn (runs of 1s in the mask), U = number
  of turns, so neighbouring turns differ by exactly α.
* ``lata``: × L_i^(1−p) (p = `length_exponent`, 0.5 = √L). Combined with veRL's
  ``loss_agg_mode=seq-mean-token-mean`` (which divides every sequence by its own L_i) the per-token policy
  gradient weight is exactly A/L_i^p. ``seed_compat`` reproduces the original instead: × w_token / L_i^p, meant
  for ``token-mean`` (the original "LATA" always included the α = 1.05 per-token discount).
* ``lata_turn_discount``: both multipliers.

Numerics: every normaliser (group statistics, turn returns, the discount's Σ α^… per row — a sum of per-run
geometric series — and the LATA scale) is computed in float64, exponentials in log space with max-shifted
log-sum-exp, on small per-row / per-turn tables. Only the final per-token values are materialised in the
advantages' dtype: token-unit weights as blocks exp(c_row − t0·log α)·α^−(t−t0) whose factors both stay in
range, so weights far below a row's largest (< ~1e−38 of it in float32) flush to 0 instead of overflowing. Empty
masks, single-token responses, singleton groups and very long responses give finite values (empty rows are 0).
Cost at 256 × 12,288: within 2× of veRL's `grpo` (benchmarks/bench_estimators.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

ADVANTAGES = ("grpo", "turn_discount", "lata", "lata_turn_discount")
DISCOUNT_UNITS = ("token", "turn")
CREDITS = ("trajectory", "turn")


def group_ids(index: Sequence[Any] | None, n: int, device: torch.device | None = None) -> torch.Tensor:
    """Dense group ids (0..G-1) for a sequence of hashable group keys; None = every row its own group."""
    if index is None:
        return torch.arange(n, device=device)
    mapping: dict[Any, int] = {}
    ids = [mapping.setdefault(k, len(mapping)) for k in (x.item() if hasattr(x, "item") else x for x in index)]
    return torch.tensor(ids, dtype=torch.long, device=device)


def group_stats(scores: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row group mean and unbiased std of float64 `scores` (bs,). Singleton groups: mean 0, std 1 (veRL)."""
    g = int(gid.max().item()) + 1 if gid.numel() else 0
    count = torch.zeros(g, dtype=torch.float64, device=scores.device).index_add_(0, gid, torch.ones_like(scores))
    total = torch.zeros(g, dtype=torch.float64, device=scores.device).index_add_(0, gid, scores)
    mean = total / count
    dev2 = (scores - mean[gid]) ** 2
    ss = torch.zeros(g, dtype=torch.float64, device=scores.device).index_add_(0, gid, dev2)
    std = torch.sqrt(ss / (count - 1).clamp(min=1.0))
    single = count[gid] <= 1
    row_mean = torch.where(single, torch.zeros_like(scores), mean[gid])
    row_std = torch.where(single, torch.ones_like(scores), std[gid])
    return row_mean, row_std


def turn_index(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each token: index of its assistant turn (−1 where the mask is 0); per row: number of turns; per token:
    position of the first token of its turn (0 where the mask is 0). (Diagnostics and tests.)"""
    runs = _runs(response_mask)
    tid = _paint(runs.k.to(torch.float64), runs, response_mask.shape, torch.float64, fill=-1.0).long()
    start = _paint(runs.start.to(torch.float64), runs, response_mask.shape, torch.float64).long()
    return tid, runs.n_turns, start


class _Runs(NamedTuple):
    """The assistant turns of a batch as a small table: one entry per run of 1s in the mask, row-major."""

    row: torch.Tensor  # (R,) row of the run
    k: torch.Tensor  # (R,) index of the run within its row
    start: torch.Tensor  # (R,) first position
    end: torch.Tensor  # (R,) last position (inclusive)
    n_turns: torch.Tensor  # (bs,) runs per row
    L: torch.Tensor  # (bs,) float64 valid tokens per row


def _nonzero_2d(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the True entries of a 2-D bool tensor, row-major. On CPU numpy's flatnonzero is an order
    of magnitude faster than torch.nonzero for the few-percent-dense transition masks seen here."""
    if x.device.type == "cpu":
        flat = torch.from_numpy(np.flatnonzero(x.contiguous().numpy()))
        w = x.shape[1]
        return flat // w, flat % w
    nz = x.nonzero()
    return nz[:, 0], nz[:, 1]


def _runs(mask: torch.Tensor) -> _Runs:
    """Run table from the mask's 0/1 transitions (one conversion pass, one comparison, one nonzero)."""
    bs, T = mask.shape
    dev = mask.device
    if T == 0:
        e = torch.zeros(0, dtype=torch.long, device=dev)
        return _Runs(e, e, e, e, torch.zeros(bs, dtype=torch.long, device=dev), torch.zeros(bs, dtype=torch.float64, device=dev))
    m8 = mask if mask.dtype in (torch.bool, torch.int8, torch.uint8) else (mask != 0).to(torch.int8) if mask.is_floating_point() else mask.to(torch.int8)
    r_t, p_t = _nonzero_2d(m8[:, 1:] != m8[:, :-1])  # boundary between p and p+1
    rising = m8[r_t, p_t + 1] != 0
    first_on = (m8[:, 0] != 0).nonzero().flatten()
    last_on = (m8[:, -1] != 0).nonzero().flatten()
    s_row = torch.cat([first_on, r_t[rising]])
    s_pos = torch.cat([torch.zeros_like(first_on), p_t[rising] + 1])
    e_row = torch.cat([r_t[~rising], last_on])
    e_pos = torch.cat([p_t[~rising], torch.full_like(last_on, T - 1)])
    s_ord = torch.argsort(s_row * T + s_pos)
    e_ord = torch.argsort(e_row * T + e_pos)
    row, start, end = s_row[s_ord], s_pos[s_ord], e_pos[e_ord]
    n_turns = torch.bincount(row, minlength=bs)
    first = torch.cumsum(n_turns, 0) - n_turns
    k = torch.arange(row.shape[0], device=dev) - first[row]
    L = torch.zeros(bs, dtype=torch.float64, device=dev).index_add_(0, row, (end - start + 1).to(torch.float64))
    return _Runs(row, k, start, end, n_turns, L)


def _paint(values: torch.Tensor, runs: _Runs, shape: tuple[int, int], dtype: torch.dtype, fill: float = 0.0) -> torch.Tensor:
    """Per-run values (R,) spread over their tokens, `fill` elsewhere: one repeat_interleave pass."""
    bs, T = shape
    R = runs.row.shape[0]
    dev = values.device
    prev_end = torch.full((R,), -1, dtype=torch.long, device=dev)
    if R > 1:
        same = runs.row[1:] == runs.row[:-1]
        prev_end[1:] = torch.where(same, runs.end[:-1], prev_end[1:])
    last_end = torch.full((bs,), -1, dtype=torch.long, device=dev).scatter_reduce(0, runs.row, runs.end, "amax")
    n_before = torch.cumsum(runs.n_turns, 0)  # runs in rows <= i
    idx = torch.arange(R, device=dev)
    gap_at = 2 * idx + runs.row
    tail_at = 2 * n_before + torch.arange(bs, device=dev)
    lengths = torch.empty(2 * R + bs, dtype=torch.long, device=dev)
    vals = torch.full((2 * R + bs,), fill, dtype=dtype, device=dev)
    lengths[gap_at] = runs.start - prev_end - 1
    lengths[gap_at + 1] = runs.end - runs.start + 1
    vals[gap_at + 1] = values.to(dtype)
    lengths[tail_at] = T - 1 - last_end
    if dev.type == "cpu":
        return torch.from_numpy(np.repeat(vals.numpy(), lengths.numpy())).view(bs, T)
    return torch.repeat_interleave(vals, lengths, output_size=bs * T).view(bs, T)


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


def _turn_weights(runs: _Runs, la: float) -> torch.Tensor:
    """Per-run weight ∝ α^(K−1−k), normalised so the mean over the row's valid tokens is 1 (float64, log space)."""
    K = runs.n_turns.to(torch.float64)[runs.row]
    n = (runs.end - runs.start + 1).to(torch.float64)
    logw = (K - 1.0 - runs.k.to(torch.float64)) * la
    logz = _row_logsumexp(logw + torch.log(n), runs.row, runs.L.shape[0])
    return torch.exp(logw - logz[runs.row] + torch.log(runs.L[runs.row]))


def _token_log_offset(runs: _Runs, la: float) -> torch.Tensor:
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


def _token_weight_matrix(runs: _Runs, shape: tuple[int, int], la: float, dtype: torch.dtype) -> torch.Tensor:
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
    runs = _runs(response_mask)
    la = math.log(alpha)
    shape = tuple(response_mask.shape)
    if unit == "token":
        ones = _paint(torch.ones_like(runs.L[runs.row]), runs, shape, torch.float64)
        return _token_weight_matrix(runs, shape, la, torch.float64) * ones
    return _paint(_turn_weights(runs, la), runs, shape, torch.float64)


def _run_returns(r: torch.Tensor, runs: _Runs, total: torch.Tensor) -> torch.Tensor:
    """Per run: Σ of rewards from its first token to the end of the response (float64)."""
    bs, T = r.shape
    # Segment sums over [start_k, start_{k+1}) with an extra segment at every row start, in one pass.
    offs = torch.cat([torch.arange(bs, device=r.device) * T, runs.row * T + runs.start])
    is_run = torch.cat([torch.zeros(bs, dtype=torch.bool, device=r.device), torch.ones_like(runs.row, dtype=torch.bool)])
    order = torch.argsort(offs * 2 + is_run.long(), stable=True)
    offs, is_run = offs[order], is_run[order]
    keep = torch.ones_like(is_run)
    keep[:-1] = offs[:-1] != offs[1:]  # a run starting at position 0 shares the row-start offset: keep the run
    flat = r.reshape(-1)
    if flat.device.type == "cpu":
        seg = torch.from_numpy(np.add.reduceat(flat.detach().numpy(), offs[keep].numpy(), dtype=np.float64))
    else:
        cum = torch.cumsum(flat, 0, dtype=torch.float64)
        o = offs[keep]
        ends = torch.cat([o[1:], torch.tensor([flat.numel()], device=o.device)]) - 1
        seg = cum[ends] - torch.cat([torch.zeros(1, dtype=torch.float64, device=o.device), cum[o[1:] - 1]])
    # Map each kept offset back to (row, cumulative within row); a run's return = row total − sum before it.
    seg_full = torch.zeros(offs.shape[0], dtype=torch.float64, device=r.device)
    seg_full[keep] = seg.to(r.device)
    row_of = offs // T
    cum_seg = torch.cumsum(seg_full, 0)
    row_base = torch.zeros(bs, dtype=torch.float64, device=r.device).index_add_(0, row_of, seg_full)
    row_base = torch.cumsum(row_base, 0) - row_base  # Σ of all earlier rows
    before = cum_seg - seg_full - row_base[row_of]  # Σ of this row's segments before this offset
    run_before = before[is_run]
    # is_run entries are in (row, start) order, the same order as the run table.
    return total[runs.row] - run_before


def compute_turn_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Float64 return-to-go of each token's assistant turn: Σ of rewards from the first token of its turn to the
    end of the response (0 where the mask is 0)."""
    runs = _runs(response_mask)
    total = token_level_rewards.sum(dim=1, dtype=torch.float64)
    g = _run_returns(token_level_rewards, runs, total)
    return _paint(g, runs, tuple(response_mask.shape), torch.float64)


def compute_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None,
    *,
    advantage: str = "grpo",
    alpha: float = 1.05,
    discount_unit: str = "turn",
    length_exponent: float = 0.5,
    seed_compat: bool = False,
    credit: str = "trajectory",
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantages of one estimator (module docstring). Returns (advantages, returns), dtype of the rewards.

    Per-row and per-turn quantities (group statistics, returns, discount normalisers, LATA scales) are computed
    in float64, in log space where exponentials are involved, on small tables; the (bs, T) work is a few passes:
    the run table, one paint of per-turn values and, for the token unit, one blocked outer product."""
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage '{advantage}'; valid: {', '.join(ADVANTAGES)}")
    if credit not in CREDITS:
        raise ValueError(f"unknown credit '{credit}'; valid: {', '.join(CREDITS)}")
    if discount_unit not in DISCOUNT_UNITS:
        raise ValueError(f"unknown discount unit '{discount_unit}'; valid: {', '.join(DISCOUNT_UNITS)}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (got {alpha})")
    out_dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    bs = token_level_rewards.shape[0]
    shape = tuple(token_level_rewards.shape)
    if bs == 0:
        z = torch.zeros_like(token_level_rewards, dtype=out_dtype)
        return z, z.clone()
    scores = token_level_rewards.sum(dim=1, dtype=torch.float64)
    gid = group_ids(index, bs, token_level_rewards.device)
    mean, std = group_stats(scores, gid)
    denom = (std + epsilon) if norm_by_std else torch.ones_like(std)
    row_adv = (scores - mean) / denom

    lata = advantage in ("lata", "lata_turn_discount")
    if seed_compat:
        unit = "token" if advantage != "grpo" else None  # the original discounts in both variants
    else:
        unit = discount_unit if advantage in ("turn_discount", "lata_turn_discount") else None

    if credit == "trajectory" and unit is None:
        # Same shape of work as veRL's grpo: one scalar per row broadcast over the mask.
        row = row_adv
        if lata:
            L = response_mask.sum(dim=1).to(torch.float64).clamp(min=1.0)
            row = row * (L.pow(-length_exponent) if seed_compat else L.pow(1.0 - length_exponent))
        adv = row.to(out_dtype).unsqueeze(1) * response_mask.to(out_dtype)
        return adv, adv.clone()

    runs = _runs(response_mask)
    la = math.log(alpha)
    if credit == "turn":
        per_run = (_run_returns(token_level_rewards, runs, scores) - mean[runs.row]) / denom[runs.row]
    else:
        per_run = row_adv[runs.row]
    if lata:
        Lr = runs.L[runs.row].clamp(min=1.0)
        per_run = per_run * (Lr.pow(-length_exponent) if seed_compat else Lr.pow(1.0 - length_exponent))
    if unit == "turn":
        per_run = per_run * _turn_weights(runs, la)
    adv = _paint(per_run, runs, shape, out_dtype)
    if unit == "token":
        adv = adv * _token_weight_matrix(runs, shape, la, out_dtype)
    return adv, adv.clone()
