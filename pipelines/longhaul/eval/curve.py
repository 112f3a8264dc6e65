"""The learning curve of a run (pure): what the end-of-run summary shows, one point per step.

- A trained step, from the rollout traces of its episodes (`training_step_metrics`, logged on the training run
  as `train/...` metrics when the grpo stage ends): the mean reward the episodes trained with (outcome plus the
  weighted process score), the mean outcome (τ²'s binary reward, i.e. the share of the step's episodes that
  succeeded) and how the episodes ended.
- An evaluated checkpoint, from its evaluation summary (`longhaul.eval.metrics`): pass^1 with c/n per subset,
  the do-nothing agent's floor beside it, and how the evaluated episodes ended.

`build_learning_curve` joins both by step: checkpoint N is the policy after training step N, and step 0 is the
initial policy (evaluated, never trained).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from longhaul.envs.trajectory import Termination
from longhaul.eval.metrics import UNKNOWN_TERMINATION, count_terminations

#: Metrics of a trained step (`training_step_metrics`), logged on the training run at that step.
TRAIN_REWARD = "train/reward_mean"
TRAIN_OUTCOME = "train/outcome_mean"
TRAIN_EPISODES = "train/episodes"
TRAIN_TERMINATIONS = "train/terminations/"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def training_step_metrics(lines: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The metrics of one trained step from its episodes' rollout-trace lines (`longhaul.agentloop.traces`):
    episodes, mean reward and outcome (over the episodes that recorded them), and one count per termination."""
    lines = list(lines)
    rewards = [line.get("reward") or {} for line in lines]
    out: dict[str, float] = {TRAIN_EPISODES: float(len(lines))}
    for key, field_name in ((TRAIN_REWARD, "score"), (TRAIN_OUTCOME, "outcome")):
        mean = _mean([float(r[field_name]) for r in rewards if isinstance(r.get(field_name), int | float)])
        if mean is not None:
            out[key] = mean
    ends = count_terminations(line.get("termination") for line in lines)
    out.update({f"{TRAIN_TERMINATIONS}{reason}": float(n) for reason, n in ends.items()})
    return out


def training_metric_keys() -> list[str]:
    """Every key `training_step_metrics` can write (a termination count for each `Termination` and the unknown)."""
    reasons = [*(t.value for t in Termination), UNKNOWN_TERMINATION]
    return [TRAIN_EPISODES, TRAIN_REWARD, TRAIN_OUTCOME, *(f"{TRAIN_TERMINATIONS}{r}" for r in reasons)]


@dataclass(frozen=True)
class SubsetPoint:
    """pass^1 of one subset at one checkpoint, with its counts and the do-nothing agent's pass^1 (None: unknown)."""

    pass_hat_1: float
    successes: int
    trials: int
    floor: float | None


@dataclass(frozen=True)
class CurvePoint:
    """One step of the learning curve; a field is None (or empty) when that step has no such measurement."""

    step: int
    reward: float | None = None
    outcome: float | None = None
    train_terminations: dict[str, int] = field(default_factory=dict)
    subsets: dict[str, SubsetPoint] = field(default_factory=dict)
    eval_terminations: dict[str, int] = field(default_factory=dict)


def _terminations(metrics: Mapping[str, float]) -> dict[str, int]:
    n = len(TRAIN_TERMINATIONS)
    return {k[n:]: int(v) for k, v in metrics.items() if k.startswith(TRAIN_TERMINATIONS)}


def _subset_points(summary: Mapping[str, Any], subsets: Sequence[str]) -> dict[str, SubsetPoint]:
    out = {}
    for name in subsets:
        block = (summary.get("subsets") or {}).get(name)
        if not block or "1" not in (block.get("pass_hat_k") or {}):
            continue
        out[name] = SubsetPoint(
            pass_hat_1=float(block["pass_hat_k"]["1"]),
            successes=int(block["successes"]),
            trials=int(block["trials"]),
            floor=block.get("null_agent_floor"),
        )
    return out


def build_learning_curve(
    train: Mapping[int, Mapping[str, float]], evals: Mapping[int, Mapping[str, Any]], subsets: Sequence[str]
) -> list[CurvePoint]:
    """Points for every step that was trained (`train`: step → `training_step_metrics`) or evaluated (`evals`:
    step → evaluation summary), in step order; `subsets` are the evaluation subsets to show (absent ones and
    summaries without pass^1 are skipped)."""
    points = []
    for step in sorted(set(train) | set(evals)):
        t, e = train.get(step, {}), evals.get(step, {})
        points.append(
            CurvePoint(
                step=step,
                reward=t.get(TRAIN_REWARD),
                outcome=t.get(TRAIN_OUTCOME),
                train_terminations=_terminations(t),
                subsets=_subset_points(e, subsets),
                eval_terminations={str(k): int(v) for k, v in (e.get("terminations") or {}).items()},
            )
        )
    return points


def format_terminations(counts: Mapping[str, int]) -> str:
    """`user_stop 7/8, max_turns 1/8`: each way the episodes ended, most frequent first ("" for none)."""
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{reason} {n}/{total}" for reason, n in ranked if n)


def format_subset(point: SubsetPoint | None) -> str:
    """`0.250 (2/8)`: pass^1 and the trials that succeeded ("-" when the subset was not evaluated)."""
    return "-" if point is None else f"{point.pass_hat_1:.3f} ({point.successes}/{point.trials})"


def subset_floors(points: Sequence[CurvePoint]) -> dict[str, float | None]:
    """The do-nothing agent's pass^1 per subset (the same at every checkpoint: it depends on the tasks only)."""
    floors: dict[str, float | None] = {}
    for p in points:
        for name, sp in p.subsets.items():
            floors.setdefault(name, sp.floor)
    return floors
