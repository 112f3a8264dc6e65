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

Weights are computed in float64 in log space (max-shifted log-sum-exp), so empty masks, single-token responses,
singleton groups and very long responses give finite values (empty rows are all zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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
    position of the first token of its turn (0 where the mask is 0)."""
    m = response_mask.bool()
    prev = torch.zeros_like(m)
    prev[:, 1:] = m[:, :-1]
    start = m & ~prev
    tid = torch.cumsum(start.to(torch.int64), dim=1) - 1
    tid = torch.where(m, tid, torch.full_like(tid, -1))
    n_turns = start.sum(dim=1)
    pos = torch.arange(m.shape[1], device=m.device).expand_as(tid)
    start_pos = torch.cummax(torch.where(start, pos, torch.zeros_like(pos)), dim=1).values
    start_pos = torch.where(m, start_pos, torch.zeros_like(start_pos))
    return tid, n_turns, start_pos


def discount_weights(response_mask: torch.Tensor, alpha: float, unit: str) -> torch.Tensor:
    """Float64 weights ∝ α^(U−1−u) over valid tokens, mean 1 over each row's valid tokens, 0 elsewhere."""
    if unit not in DISCOUNT_UNITS:
        raise ValueError(f"unknown discount unit '{unit}'; valid: {', '.join(DISCOUNT_UNITS)}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (got {alpha})")
    m = response_mask.bool()
    L = m.sum(dim=1, keepdim=True).to(torch.float64)
    if unit == "token":
        u = torch.arange(m.shape[1], device=m.device, dtype=torch.float64).expand(m.shape)
        U = L
    else:
        tid, n_turns, _ = turn_index(response_mask)
        u = tid.to(torch.float64)
        U = n_turns.unsqueeze(1).to(torch.float64)
    logw = (U - 1.0 - u) * math.log(alpha)
    logw = torch.where(m, logw, torch.full_like(logw, -math.inf))
    lse = torch.logsumexp(logw, dim=1, keepdim=True)
    safe_lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w = torch.exp(logw - safe_lse) * L
    return torch.where(m, w, torch.zeros_like(w))


def compute_turn_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Float64 return-to-go of each token's assistant turn: Σ of rewards from the first token of its turn to the
    end of the response (0 where the mask is 0)."""
    r = token_level_rewards.to(torch.float64)
    suffix = torch.flip(torch.cumsum(torch.flip(r, dims=[1]), dim=1), dims=[1])
    _, _, start_pos = turn_index(response_mask)
    g = torch.gather(suffix, 1, start_pos)
    return torch.where(response_mask.bool(), g, torch.zeros_like(g))


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
    """The advantages of one estimator (module docstring). Returns (advantages, returns), dtype of the rewards."""
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage '{advantage}'; valid: {', '.join(ADVANTAGES)}")
    if credit not in CREDITS:
        raise ValueError(f"unknown credit '{credit}'; valid: {', '.join(CREDITS)}")
    m = response_mask.bool()
    out_dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    bs = token_level_rewards.shape[0]
    if bs == 0:
        z = torch.zeros_like(token_level_rewards, dtype=out_dtype)
        return z, z.clone()
    scores = token_level_rewards.to(torch.float64).sum(dim=1)
    gid = group_ids(index, bs, token_level_rewards.device)
    mean, std = group_stats(scores, gid)
    denom = (std + epsilon) if norm_by_std else torch.ones_like(std)
    if credit == "turn":
        adv = (compute_turn_returns(token_level_rewards, response_mask) - mean.unsqueeze(1)) / denom.unsqueeze(1)
    else:
        adv = ((scores - mean) / denom).unsqueeze(1).expand(m.shape)
    L = m.sum(dim=1).to(torch.float64)
    if advantage != "grpo":
        lata = advantage in ("lata", "lata_turn_discount")
        if seed_compat:
            # The original: Turn-Discount and LATA both apply the per-token discount; LATA divides by L^p.
            adv = adv * discount_weights(response_mask, alpha, "token")
            if lata:
                adv = adv / L.clamp(min=1.0).pow(length_exponent).unsqueeze(1)
        else:
            if advantage in ("turn_discount", "lata_turn_discount"):
                adv = adv * discount_weights(response_mask, alpha, discount_unit)
            if lata:
                adv = adv * L.clamp(min=1.0).pow(1.0 - length_exponent).unsqueeze(1)
    adv = torch.where(m, adv, torch.zeros((), dtype=torch.float64, device=adv.device)).to(out_dtype)
    return adv, adv.clone()
