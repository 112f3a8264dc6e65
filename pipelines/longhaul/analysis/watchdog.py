"""Collapse watchdog: pure checks over metric histories that flag a training run going wrong.

Three signals seen in the original ablations (notes/method.md g.1-g.2):

- **response_length_collapse** — the mean response length falls far below its earlier peak (vanilla GRPO went
  ≈3000 → ≈1100 tokens while pass^1 dropped).
- **saturated_groups** — every GRPO group has the same reward for many steps, so advantages are all zero and
  the policy stops learning (group score std ≈ 2.5e-10 in the original's smoke).
- **val_eval_gap** — validation reward far above the evaluation pass^1 of the same checkpoint (0.80 vs 0.125
  in the original: a reward leak or a process term counted as success).

Inputs are histories `{metric key: [(step, value), ...]}` as MLflow returns them; output is a list of
`Alert`s. `fetch_`/`log_` functions in `longhaul.tracking.alerts` do the MLflow I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

History = Sequence[tuple[int, float]]


@dataclass(frozen=True)
class WatchdogThresholds:
    """Thresholds of the watchdog (the spec only switches early stopping on; these are the documented values)."""

    #: Steps averaged per window (the latest window is compared with the best earlier one).
    window: int = 10
    #: Alert when the latest window's mean response length < this fraction of the best earlier window.
    length_collapse_ratio: float = 0.5
    #: Alert when this many consecutive latest steps have all groups saturated.
    saturated_steps: int = 10
    #: A step counts as saturated when the outcome-saturated group fraction is at least this.
    saturated_fraction: float = 0.95
    #: |advantage| below this everywhere in a batch = every group saturated (when no fraction metric exists).
    zero_advantage_eps: float = 1e-6
    #: Alert when validation reward − eval pass^1 of the same checkpoint exceeds this.
    val_eval_gap: float = 0.3
    #: Metric keys, tried in order.
    length_keys: tuple[str, ...] = ("response_length/mean", "train/response_length/mean")
    #: Fractions of groups whose outcomes are all 0 / all 1 (longhaul.algos.diagnostics), summed per step.
    saturated_fraction_keys: tuple[str, ...] = ("saturation/frac_all_fail", "saturation/frac_all_success")
    advantage_max_key: str = "critic/advantages/max"
    advantage_min_key: str = "critic/advantages/min"
    val_key_pattern: str = r"^(val-core/.+/(reward|score)/mean(@|_at_)\d+|val/reward/mean|val/score)$"
    eval_key: str = "eval/pass_hat_k/1"


@dataclass(frozen=True)
class Alert:
    """One watchdog finding."""

    code: str
    step: int
    value: float
    threshold: float
    message: str
    collapse: bool = field(default=True)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _sorted(h: History) -> list[tuple[int, float]]:
    last: dict[int, float] = {}
    for step, value in h:
        last[int(step)] = float(value)  # later entries for the same step win (resumed runs re-log)
    return sorted(last.items())


def _first(histories: Mapping[str, History], keys: Sequence[str]) -> tuple[str, list[tuple[int, float]]] | None:
    for k in keys:
        if histories.get(k):
            return k, _sorted(histories[k])
    return None


def check_length_collapse(histories: Mapping[str, History], th: WatchdogThresholds) -> list[Alert]:
    found = _first(histories, th.length_keys)
    if found is None:
        return []
    key, points = found
    w = th.window
    if len(points) < 2 * w:
        return []
    values = [v for _, v in points]
    means = [sum(values[i : i + w]) / w for i in range(len(values) - w + 1)]
    latest, best = means[-1], max(means[: len(means) - w] or [means[0]])
    if best <= 0 or latest >= th.length_collapse_ratio * best:
        return []
    ratio = latest / best
    return [
        Alert(
            "response_length_collapse",
            points[-1][0],
            ratio,
            th.length_collapse_ratio,
            f"{key}: mean of the last {w} steps is {latest:.0f}, {ratio:.0%} of the earlier peak {best:.0f} "
            f"(alert below {th.length_collapse_ratio:.0%})",
        )
    ]


def _saturated_steps(
    histories: Mapping[str, History], th: WatchdogThresholds
) -> tuple[str, list[tuple[int, bool]]] | None:
    parts = [dict(_sorted(histories[k])) for k in th.saturated_fraction_keys if histories.get(k)]
    if parts:
        steps = sorted(set().union(*parts))
        total = [(s, sum(p.get(s, 0.0) for p in parts)) for s in steps]
        key = " + ".join(k for k in th.saturated_fraction_keys if histories.get(k))
        return key, [(s, v >= th.saturated_fraction) for s, v in total]
    hi, lo = histories.get(th.advantage_max_key), histories.get(th.advantage_min_key)
    if not hi or not lo:
        return None
    lo_by_step = dict(_sorted(lo))
    steps = [
        (s, abs(v) < th.zero_advantage_eps and abs(lo_by_step[s]) < th.zero_advantage_eps)
        for s, v in _sorted(hi)
        if s in lo_by_step
    ]
    return f"{th.advantage_min_key}..{th.advantage_max_key}", steps


def check_saturated_groups(histories: Mapping[str, History], th: WatchdogThresholds) -> list[Alert]:
    found = _saturated_steps(histories, th)
    if found is None:
        return []
    key, steps = found
    run = 0
    for _, saturated in reversed(steps):
        if not saturated:
            break
        run += 1
    if run < th.saturated_steps:
        return []
    return [
        Alert(
            "saturated_groups",
            steps[-1][0],
            float(run),
            float(th.saturated_steps),
            f"{key}: every GRPO group had identical rewards for the last {run} steps (advantages all zero; "
            f"alert after {th.saturated_steps}) — no learning signal",
        )
    ]


def check_val_eval_gap(histories: Mapping[str, History], th: WatchdogThresholds) -> list[Alert]:
    evals = histories.get(th.eval_key)
    pattern = re.compile(th.val_key_pattern)
    val_keys = sorted(k for k in histories if pattern.match(k) and histories[k])
    if not evals or not val_keys:
        return []
    val_key = val_keys[0]
    vals = _sorted(histories[val_key])
    alerts = []
    for step, ev in _sorted(evals):
        before = [v for s, v in vals if s <= step]
        if not before:
            continue
        gap = before[-1] - ev
        if gap > th.val_eval_gap:
            alerts.append(
                Alert(
                    "val_eval_gap",
                    step,
                    gap,
                    th.val_eval_gap,
                    f"step {step}: validation reward {before[-1]:.3f} ({val_key}) exceeds evaluation pass^1 "
                    f"{ev:.3f} by {gap:.3f} (alert above {th.val_eval_gap}) — check for a reward leak or a "
                    "process term counted as success",
                    collapse=False,
                )
            )
    return alerts[-1:]  # the latest checkpoint's verdict


def compute_alerts(histories: Mapping[str, History], thresholds: WatchdogThresholds | None = None) -> list[Alert]:
    """All watchdog alerts for one training run's metric histories (pure)."""
    th = thresholds or WatchdogThresholds()
    return [
        *check_length_collapse(histories, th),
        *check_saturated_groups(histories, th),
        *check_val_eval_gap(histories, th),
    ]


def should_stop(alerts: Sequence[Alert], early_stop_on_collapse: bool) -> bool:
    """Whether training should stop: early stop is on (spec.tracking.early_stop_on_collapse) and a collapse fired."""
    return early_stop_on_collapse and any(a.collapse for a in alerts)


def watched_metric_keys(histories_available: Sequence[str], thresholds: WatchdogThresholds | None = None) -> list[str]:
    """Which of the available metric keys the watchdog reads (to fetch only those histories)."""
    th = thresholds or WatchdogThresholds()
    wanted = {*th.length_keys, *th.saturated_fraction_keys, th.advantage_max_key, th.advantage_min_key, th.eval_key}
    pattern = re.compile(th.val_key_pattern)
    return sorted(k for k in histories_available if k in wanted or pattern.match(k))
