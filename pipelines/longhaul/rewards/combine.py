"""Outcome + process reward, and how the reward is laid out over the response tokens.

``score = outcome + weight · process`` (the original `prm_lite` reward mode; `process = 0` when
`spec.reward.process` is `none`).

Credit (`spec.reward.credit`) decides where the reward sits in veRL's `token_level_rewards` (bs, T). Every
layout sums to `score`, so anything that only sums (veRL's own `grpo`, validation metrics, the v0 trainer
which only forwards the scalar) sees exactly the trajectory-credit reward.

* ``trajectory`` (the original): the whole score on the last response position; estimators sum the row, so
  every token of the trajectory sees one scalar.
* ``turn``: turn k's process share ``weight · q_k`` (`PrmLiteResult.turn_scores`, which sum to `process`) sits
  on the **first token of assistant turn k** (the k-th run of 1s in `response_mask`), and the trajectory-level
  reward (the outcome) on the last response position. The estimator (which sees only the right-padded row,
  not the response length) decodes it exactly: ``q_k = r[start_k]``, ``outcome = Σ r − Σ_k q_k``
  (`longhaul.algos.estimators.compute_turn_credit`). Why the first token: it is the one position of a turn
  that no other reward can share — the last response position is the end of the final turn whenever the
  response ends with an assistant turn, so "last token of the turn" could not tell the outcome from the last
  turn's share.

  Special cases, all keeping the sum: more scored turns than runs (the response was cut by the token budget):
  the shares of the missing turns are added to the last run's share. The last run is one token long at the
  last response position (its first token IS the last position): the outcome moves one position back, onto
  the masked tool/user token before it, which is no run start. A one-token response (mask ``[1]``) has a
  single position: share and outcome share it and decode as that turn's share (outcome read as 0) — a
  degenerate response, documented rather than special-cased. A response without a policy token holds the
  whole score on its last position, as veRL does with a scalar (decoded as the outcome). If the row reaches
  the estimator in the trajectory layout instead (the v0 trainer), it decodes as all shares 0, i.e. turn
  credit falls back to trajectory credit, except for a final one-token run at the last position, whose start
  then holds the score.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from longhaul.rewards.prm_lite import PrmLiteResult
from longhaul.spec.reward import Credit, ProcessReward


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


@dataclass(frozen=True)
class RewardSettings:
    """What the reward of a trajectory depends on: `spec.reward` and `spec.algorithm.seed_compat`. The agent loop
    (training), `longhaul explain` and the estimator settings all read the reward through this one class, so they
    cannot disagree on when the process reward counts or with which weight. Field order is the order of the
    agent-loop YAML (`to_dict`)."""

    process: str
    weight: float
    credit: str
    rules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    seed_compat: bool = False

    @classmethod
    def from_spec(cls, exp: Any) -> RewardSettings:
        """The settings of an Experiment (or ExperimentSpec)."""
        spec = exp.spec if hasattr(exp, "spec") else exp
        rew = spec.reward
        return cls(
            process=str(getattr(rew.process, "value", rew.process)),
            weight=float(rew.weight),
            credit=str(getattr(rew.credit, "value", rew.credit)),
            rules=rew.rules.overrides(),
            seed_compat=bool(spec.algorithm.seed_compat),
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RewardSettings:
        """Read `to_dict`'s mapping back (the agent loop gets it through veRL's agent-loop YAML)."""
        return cls(
            process=str(d["process"]),
            weight=float(d["weight"]),
            credit=str(d["credit"]),
            rules={k: dict(v) for k, v in (d.get("rules") or {}).items()},
            seed_compat=bool(d["seed_compat"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values for YAML, in field order."""
        return {
            "process": self.process,
            "weight": self.weight,
            "credit": self.credit,
            "rules": {k: dict(v) for k, v in self.rules.items()},
            "seed_compat": self.seed_compat,
        }

    @property
    def process_on(self) -> bool:
        """Whether PRM-Lite's process reward is part of the training reward."""
        return self.process == ProcessReward.PRM_LITE

    @property
    def process_weight(self) -> float:
        """The weight the process reward enters the score with (0 when it is off)."""
        return self.weight if self.process_on else 0.0

    def combine(self, outcome: float, prm: PrmLiteResult | None) -> RewardBreakdown:
        """The training reward of a trajectory: `combine_reward` with the process reward only when it is on, so
        a caller that scored PRM-Lite for display (`longhaul explain`) gets the reward training used."""
        return combine_reward(outcome, prm if self.process_on else None, self.weight)


def turn_start_positions(response_mask: Sequence[int]) -> list[int]:
    """Index of the first token of every run of 1s (one run per assistant turn), in order."""
    starts = []
    prev = 0
    for i, m in enumerate(response_mask):
        if m and not prev:
            starts.append(i)
        prev = m
    return starts


def build_token_rewards(reward: RewardBreakdown, response_mask: Sequence[int], credit: str) -> list[float]:
    """The per-token reward row for one response (same length as `response_mask`); layouts in the module
    docstring. The row always sums to `score`."""
    n = len(response_mask)
    row = [0.0] * n
    if n == 0:
        return row
    if credit not in tuple(Credit):
        raise ValueError(f"unknown credit '{credit}'; valid: {', '.join(Credit)}")
    starts = turn_start_positions(response_mask) if credit == Credit.TURN and reward.turn_rewards else []
    if not starts:
        row[n - 1] = reward.score
        return row
    for k, r in enumerate(reward.turn_rewards):
        row[starts[min(k, len(starts) - 1)]] += r
    outcome_at = n - 2 if starts[-1] == n - 1 and n >= 2 else n - 1
    row[outcome_at] += reward.outcome
    return row
