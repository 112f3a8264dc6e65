"""Advantage estimators: GRPO, Turn-Discount, LATA and their combination (method.md b), pure torch.

Inputs are veRL's: `token_level_rewards` (bs, T), `response_mask` (bs, T; 1 = policy token, 0 = prompt-side
tool/user tokens and padding) and a group index (one hashable per row, veRL's `uid`). Outputs are
(advantages, returns), both (bs, T), zero wherever the mask is 0. An assistant turn is a run of 1s in the mask.

Step 1, the group-relative advantage.

* ``credit="trajectory"`` (the original): s_i = Σ_t r_{i,t}; A_i = (s_i − mean_g) / (std_g + ε), unbiased std,
  as veRL's `grpo`. A singleton group has mean 0 and std 1, exactly like veRL; without `norm_by_std` only the
  mean is removed. Unlike veRL, a group whose spread is a tie (std_g < `TIE_STD`: equal scores up to float
  noise) gets A = 0 instead of float noise divided by ε; and the group mean is taken relative to the group's
  first member, so identical trajectories centre to exactly 0.
* ``credit="turn"``: the reward row is read back as per-turn process shares and one trajectory-level reward
  (layout in `longhaul.rewards.combine`): q_{i,k} = r_{i,start_k} (first token of turn k) and
  o_i = Σ_t r_{i,t} − Σ_k q_{i,k} (the outcome). Then, for the tokens of turn k of trajectory i in group g:

      A_{i,k} = a_i + d_{i,k}
      a_i     = (o_i − mean_g(o)) / (std_g(o) + ε)           0 when std_g(o) < TIE_STD (a tie)
      d_{i,k} = (q_{i,k} − b_{g,k}) / max(std_g(o), 1)       b_{g,k} = mean of q_{j,k} over the group's
                                                             trajectories j that have a turn k; d = 0 when
                                                             i is the only one (no comparable turn)

  Without `norm_by_std` both divisors are 1 (only means are removed). Singleton groups keep veRL's
  a_i = o_i/(1 + ε) and have d = 0.

  Why this rule. (1) The outcome is a property of the whole episode that no single turn owns, so every token
  of the trajectory gets the same outcome term, exactly GRPO's. (2) A turn's own process share reaches only
  that turn's tokens, compared with a baseline built from comparable turns — the same turn index in the
  sibling rollouts of the same task — so neither earlier nor later turns are credited with it. (3) The rule
  does not reward a turn for its position or its length: b_{g,k} is taken at the same index k, so a share
  that every rollout earns at turn k gives d = 0 whatever k is, and d depends on the turn's share only, not
  on how many tokens the turn has nor on how many turns follow it. The previous rule compared a turn's
  return-to-go (its rewards and all later ones) with the mean of whole-trajectory totals: late turns have
  fewer rewards left, so they were penalised for being late, and when the totals tied (std ≈ 0, common with a
  binary outcome and a small process term) the per-turn differences were divided by ε (veRL logged
  advantages of −47,816). (4) Scale: the process term is never scaled up. Its divisor is at least one reward
  unit (the outcome's range), so a per-turn difference of δ reward units moves the advantage by at most δ,
  and in tied groups (all-fail or all-success) the hand rules nudge the policy instead of becoming
  unit-scale advantages (method.md a.4). With a binary outcome std_g(o) ≤ √(n/(4(n−1))) ≤ 0.71, so d is
  always in raw reward units; in mixed groups the process term therefore weighs std_g(o) (≤ 0.71) times as
  much, relative to the outcome, as in GRPO on the totals — deliberate for a shaping term. (5) Both terms use
  the inclusive group mean, like GRPO; with all q = 0 the rule is exactly trajectory credit.

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

``seed_compat`` reproduces the original's numbers: trajectory credit only (the original had no per-turn
credit, method.md a.4; credit="turn" raises), plain group mean, std + ε, no tie rule.

Bounds (every estimator, credit and unit; n = group size, finite inputs). For n ≥ 2 and `norm_by_std`,
|a_i| ≤ (n−1)/√n (|x_i − x̄| ≤ (n−1)/√n · s for the unbiased s; ties give 0; seed_compat: < (n−1)/√n as
s/(s + ε) < 1); a singleton group gives |o_i|/(1+ε); without `norm_by_std`, |a_i| ≤ max_j |o_i − o_j|.
|d_{i,k}| ≤ max_j |q_{i,k} − q_{j,k}| (reward units). The multipliers are non-negative: the discount weights
have mean 1 over the row's L_i valid tokens, so each is ≤ L_i; LATA's is L_i^(1−p) ≤ L_i (seed_compat:
L_i^−p ≤ 1). So |Â_{i,t}| ≤ (bound of a_i + bound of d_{i,k}) × w_{i,t} × L_i^(1−p) ≤ (…) × L_i^(2−p), and
nothing is ever divided by a spread below TIE_STD + ε (the per-turn process term: below 1).

Numerics: every normaliser (group statistics, per-turn baselines, the discount's Σ α^… per row — a sum of
per-run geometric series — and the LATA scale) is computed in float64, exponentials in log space with
max-shifted log-sum-exp, on small per-row / per-turn tables. Only the final per-token values are materialised
in the advantages' dtype: token-unit weights as blocks exp(c_row − t0·log α)·α^−(t−t0) whose factors both stay
in range, so weights far below a row's largest (< ~1e−38 of it in float32) flush to 0 instead of overflowing.
Empty masks, single-token responses, singleton groups and very long responses give finite values (empty rows
are 0). Cost at 256 × 12,288: within 2× of veRL's `grpo` (benchmarks/bench_estimators.py).

The run table of the assistant turns is in `longhaul.algos.runs`, Turn-Discount's weights in
`longhaul.algos.discount`; `discount_weights` and `turn_index` are importable from here too (`__all__`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from longhaul.algos.discount import discount_weights, token_weight_matrix, turn_weights
from longhaul.algos.runs import Runs, build_runs, paint, turn_index
from longhaul.algos.settings import ADVANTAGES, CREDITS, DISCOUNT_UNITS, DISCOUNTED, LENGTH_SCALED

__all__ = [
    "ADVANTAGES",
    "CREDITS",
    "PROCESS_SCALE_FLOOR",
    "TIE_STD",
    "TurnCredit",
    "compute_advantages",
    "compute_turn_credit",
    "discount_weights",
    "group_ids",
    "group_stats",
    "turn_index",
]

#: A group whose trajectory-level rewards have an unbiased std below this (reward units) is a tie: its
#: trajectory term is 0 rather than float noise divided by ε. Real differences are far larger (a PRM-Lite rule of
#: weight 0.01, times `spec.reward.weight`, averaged over ≤ 30 steps: ~1e−4); float32 rounding of a row's
#: entries moves a total by ~1e−7 at most.
TIE_STD = 1e-6
#: The per-turn process term is divided by max(std_g(o), PROCESS_SCALE_FLOOR): never by less than one reward
#: unit, so per-turn differences are never amplified.
PROCESS_SCALE_FLOOR = 1.0


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


def _centre(x: torch.Tensor, key: torch.Tensor, n_keys: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per entry of float64 `x` (N,) grouped by `key` (N,): x − mean of its key, the key's entry count and the
    key's unbiased std (0 for a single entry). The mean is taken relative to the key's first entry, so equal
    values centre to exactly 0 and large common offsets cost no precision."""
    n = x.shape[0]
    dev = x.device
    pos = torch.arange(n, device=dev)
    first = torch.full((n_keys,), n, dtype=torch.long, device=dev).scatter_reduce(0, key, pos, "amin")
    shifted = x - x[first[key]]
    count = torch.zeros(n_keys, dtype=torch.float64, device=dev).index_add_(0, key, torch.ones_like(x))
    mean = torch.zeros(n_keys, dtype=torch.float64, device=dev).index_add_(0, key, shifted) / count.clamp(min=1.0)
    centred = shifted - mean[key]
    ss = torch.zeros(n_keys, dtype=torch.float64, device=dev).index_add_(0, key, centred * centred)
    std = torch.sqrt(ss / (count - 1.0).clamp(min=1.0))
    return centred, count[key], std[key]


def _group_advantage(
    x: torch.Tensor, gid: torch.Tensor, norm_by_std: bool, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO advantage of float64 per-row `x` within its group and the group's unbiased std (module docstring,
    a_i): ties (std < TIE_STD) give 0; a singleton group keeps veRL's x/(1 + ε) (x without `norm_by_std`)."""
    n_groups = int(gid.max().item()) + 1
    centred, count, std = _centre(x, gid, n_groups)
    if norm_by_std:
        a = torch.where(std < TIE_STD, torch.zeros_like(x), centred / (std + epsilon))
        solo = x / (1.0 + epsilon)
    else:
        a, solo = centred, x
    return torch.where(count <= 1, solo, a), std


class TurnCredit(NamedTuple):
    """The per-turn credit of a batch (float64, module docstring): one entry per assistant turn (run of 1s in
    the mask, row-major) and the per-row trajectory terms. Token advantage before the multipliers:
    `trajectory_adv[row] + process_adv`."""

    row: torch.Tensor  # (R,) row of the turn
    k: torch.Tensor  # (R,) index of the turn within its row
    share: torch.Tensor  # (R,) q_{i,k}: the process share read at the turn's first token
    baseline: torch.Tensor  # (R,) b_{g,k}: mean share of turn k over the group's trajectories that have one
    siblings: torch.Tensor  # (R,) number of the group's trajectories that have a turn k (this one included)
    process_adv: torch.Tensor  # (R,) d_{i,k}
    outcome: torch.Tensor  # (bs,) o_i: row total − Σ_k q_{i,k}
    trajectory_adv: torch.Tensor  # (bs,) a_i


def _turn_credit(
    r: torch.Tensor, runs: Runs, scores: torch.Tensor, gid: torch.Tensor, norm_by_std: bool, epsilon: float
) -> TurnCredit:
    bs = r.shape[0]
    q = r[runs.row, runs.start].to(torch.float64)
    outcome = scores - torch.zeros(bs, dtype=torch.float64, device=r.device).index_add_(0, runs.row, q)
    traj_adv, std_o = _group_advantage(outcome, gid, norm_by_std, epsilon)
    k_max = int(runs.n_turns.max().item()) if bs else 0
    key = gid[runs.row] * max(k_max, 1) + runs.k
    n_keys = (int(gid.max().item()) + 1) * max(k_max, 1)
    centred, siblings, _ = _centre(q, key, n_keys) if q.numel() else (q, q, q)
    scale = std_o[runs.row].clamp(min=PROCESS_SCALE_FLOOR) if norm_by_std else torch.ones_like(q)
    d = torch.where(siblings >= 2, centred / scale, torch.zeros_like(q))
    return TurnCredit(runs.row, runs.k, q, q - centred, siblings, d, outcome, traj_adv)


def compute_turn_credit(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> TurnCredit:
    """The credit="turn" table of a batch: per-turn shares, baselines and advantages before the multipliers
    (diagnostics, `longhaul explain` and tests; `compute_advantages` uses the same computation)."""
    runs = build_runs(response_mask)
    scores = token_level_rewards.sum(dim=1, dtype=torch.float64)
    bs = token_level_rewards.shape[0]
    gid = group_ids(index, bs, token_level_rewards.device)
    if bs == 0:
        e = torch.zeros(0, dtype=torch.float64, device=token_level_rewards.device)
        return TurnCredit(runs.row, runs.k, e, e, e, e, e, e)
    return _turn_credit(token_level_rewards, runs, scores, gid, norm_by_std, epsilon)


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

    Per-row and per-turn quantities (group statistics, per-turn baselines, discount normalisers, LATA scales)
    are computed in float64, in log space where exponentials are involved, on small tables; the (bs, T) work is
    a few passes: the run table, one paint of per-turn values and, for the token unit, one blocked outer
    product."""
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage '{advantage}'; valid: {', '.join(ADVANTAGES)}")
    if credit not in CREDITS:
        raise ValueError(f"unknown credit '{credit}'; valid: {', '.join(CREDITS)}")
    if discount_unit not in DISCOUNT_UNITS:
        raise ValueError(f"unknown discount unit '{discount_unit}'; valid: {', '.join(DISCOUNT_UNITS)}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (got {alpha})")
    if seed_compat and credit == "turn":
        raise ValueError("seed_compat reproduces the original, which had no per-turn credit: use credit 'trajectory'")
    out_dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    bs = token_level_rewards.shape[0]
    shape = tuple(token_level_rewards.shape)
    if bs == 0:
        z = torch.zeros_like(token_level_rewards, dtype=out_dtype)
        return z, z.clone()
    scores = token_level_rewards.sum(dim=1, dtype=torch.float64)
    gid = group_ids(index, bs, token_level_rewards.device)

    lata = advantage in LENGTH_SCALED
    if seed_compat:
        unit = "token" if advantage != "grpo" else None  # the original discounts in both variants
        mean, std = group_stats(scores, gid)
        row_adv = (scores - mean) / ((std + epsilon) if norm_by_std else torch.ones_like(std))
    else:
        unit = discount_unit if advantage in DISCOUNTED else None
        row_adv = _group_advantage(scores, gid, norm_by_std, epsilon)[0] if credit == "trajectory" else None

    if credit == "trajectory" and unit is None:
        # Same shape of work as veRL's grpo: one scalar per row broadcast over the mask.
        row = row_adv
        if lata:
            L = response_mask.sum(dim=1).to(torch.float64).clamp(min=1.0)
            row = row * (L.pow(-length_exponent) if seed_compat else L.pow(1.0 - length_exponent))
        adv = row.to(out_dtype).unsqueeze(1) * response_mask.to(out_dtype)
        return adv, adv.clone()

    runs = build_runs(response_mask)
    la = math.log(alpha)
    if credit == "turn":
        tc = _turn_credit(token_level_rewards, runs, scores, gid, norm_by_std, epsilon)
        per_run = tc.trajectory_adv[runs.row] + tc.process_adv
    else:
        per_run = row_adv[runs.row]
    if lata:
        Lr = runs.L[runs.row].clamp(min=1.0)
        per_run = per_run * (Lr.pow(-length_exponent) if seed_compat else Lr.pow(1.0 - length_exponent))
    if unit == "turn":
        per_run = per_run * turn_weights(runs, la)
    adv = paint(per_run, runs, shape, out_dtype)
    if unit == "token":
        adv = adv * token_weight_matrix(runs, shape, la, out_dtype)
    return adv, adv.clone()
