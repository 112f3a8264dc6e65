"""Per-step training statistics (pure): rewards, group saturation, lengths, log-prob change."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean


def compute_group_saturation(task_ids: Sequence[str], scores: Sequence[float], outcomes: Sequence[float],
                             tol: float = 1e-9) -> dict[str, float]:
    """Fractions of GRPO groups (same task) whose rewards are all equal (zero advantage: no learning signal),
    all successes, all failures. Keys match the MLflow watchdog's (`train/saturated_group_fraction`)."""
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(task_ids):
        groups.setdefault(t, []).append(i)
    if not groups:
        return {}
    n = len(groups)
    sat = sum(1 for rows in groups.values() if max(scores[i] for i in rows) - min(scores[i] for i in rows) <= tol)
    ok = sum(1 for rows in groups.values() if all(outcomes[i] >= 1.0 for i in rows))
    bad = sum(1 for rows in groups.values() if all(outcomes[i] <= 0.0 for i in rows))
    return {
        "train/saturated_group_fraction": sat / n,
        "train/groups_all_success_fraction": ok / n,
        "train/groups_all_fail_fraction": bad / n,
        "train/groups": float(n),
    }


def summarize(values: Sequence[float], prefix: str) -> dict[str, float]:
    """mean/min/max of `values` under `prefix/` (empty input → nothing)."""
    if not values:
        return {}
    return {f"{prefix}/mean": float(mean(values)), f"{prefix}/min": float(min(values)),
            f"{prefix}/max": float(max(values))}
