"""Outcome + process reward, and how the reward is laid out over the response tokens.

``score = outcome + weight · process`` (the original `prm_lite` reward mode; `process = 0` when
`spec.reward.process` is `none`).

Credit (`spec.reward.credit`) decides where the reward sits in veRL's `token_level_rewards` (bs, T):

* ``trajectory`` (the original): the whole score on the last response token; estimators sum the row, so every
  token of the trajectory sees one scalar.
* ``turn``: turn k's process share ``weight · q_k`` (`PrmLiteResult.turn_scores`, which sum to `process`) sits on
  the **last token of assistant turn k** (the k-th run of 1s in `response_mask`), and the outcome on the last
  response token. The row still sums to `score`, so anything that only sums (veRL's own `grpo`, validation
  metrics, the v0 trainer which only forwards the scalar) sees exactly the trajectory-credit reward. The
  `longhaul_*` estimators with ``credit=turn`` read the layout back as per-turn returns-to-go (see
  `longhaul.algos.estimators.compute_turn_returns`): the tokens of turn k are credited with the rewards of turn
  k and of every later turn (including the outcome), never with those of earlier turns, which they cannot
  have caused. So a turn's own process score reaches that turn's tokens, and a penalised turn no longer drags
  down the turns that came after it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from longhaul.rewards.prm_lite import PrmLiteResult


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one trajectory: `score = outcome + weight·process`; `turn_rewards[k] = weight·q_k`."""

    score: float
    outcome: float
    process: float
    weight: float
    turn_rewards: tuple[float, ...]


def combine_reward(outcome: float, prm: PrmLiteResult | None, weight: float) -> RewardBreakdown:
    """Combine a binary outcome with a PRM-Lite result (None = no process reward)."""
    if prm is None:
        return RewardBreakdown(float(outcome), float(outcome), 0.0, 0.0, ())
    turn = tuple(weight * q for q in prm.turn_scores)
    return RewardBreakdown(float(outcome) + weight * prm.process, float(outcome), prm.process, weight, turn)


def turn_end_positions(response_mask: Sequence[int]) -> list[int]:
    """Index of the last token of every run of 1s (one run per assistant turn), in order."""
    ends = []
    prev = 0
    for i, m in enumerate(response_mask):
        if prev and not m:
            ends.append(i - 1)
        prev = m
    if prev:
        ends.append(len(response_mask) - 1)
    return ends


def build_token_rewards(reward: RewardBreakdown, response_mask: Sequence[int], credit: str) -> list[float]:
    """The per-token reward row for one response (same length as `response_mask`).

    ``trajectory``: `score` on the last token. ``turn``: `turn_rewards[k]` on the last token of run k and the
    outcome on the last token. If the response has fewer runs than scored turns (the response was cut by the
    token budget), the shares of the missing turns go to the last run; with no run at all (empty response) the
    whole score sits on the last position, as veRL does with a scalar. The row always sums to `score`.
    """
    n = len(response_mask)
    row = [0.0] * n
    if n == 0:
        return row
    if credit == "trajectory" or not reward.turn_rewards:
        row[n - 1] = reward.score
        return row
    if credit != "turn":
        raise ValueError(f"unknown credit '{credit}'; valid: trajectory, turn")
    ends = turn_end_positions(response_mask)
    if not ends:
        row[n - 1] = reward.score
        return row
    for k, r in enumerate(reward.turn_rewards):
        row[ends[min(k, len(ends) - 1)]] += r
    row[n - 1] += reward.outcome
    return row
