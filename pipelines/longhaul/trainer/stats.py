"""Per-step training statistics (pure): rewards, group saturation, lengths, log-prob change."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean


def compute_zero_signal_fraction(task_ids: Sequence[str], scores: Sequence[float], tol: float = 1e-9) -> float:
    """Fraction of GRPO groups (same task) whose trained rewards are all equal: zero advantage, no learning
    signal. Logged as `train/saturated_group_fraction` (the MLflow watchdog's key); the outcome/process
    breakdown comes from `longhaul.algos.diagnostics.compute_group_saturation`."""
    groups: dict[str, list[float]] = {}
    for t, sc in zip(task_ids, scores, strict=True):
        groups.setdefault(t, []).append(sc)
    if not groups:
        return 0.0
    return sum(1 for v in groups.values() if max(v) - min(v) <= tol) / len(groups)


def summarize(values: Sequence[float], prefix: str) -> dict[str, float]:
    """mean/min/max of `values` under `prefix/` (empty input → nothing)."""
    if not values:
        return {}
    return {f"{prefix}/mean": float(mean(values)), f"{prefix}/min": float(min(values)),
            f"{prefix}/max": float(max(values))}
