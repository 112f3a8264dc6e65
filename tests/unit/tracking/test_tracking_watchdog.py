"""Collapse watchdog over metric histories (pure)."""

from __future__ import annotations

import pytest

from longhaul.analysis.watchdog import WatchdogThresholds, compute_alerts, should_stop, watched_metric_keys


def series(values, start=1):
    return [(start + i, float(v)) for i, v in enumerate(values)]


def codes(h, **th):
    return {a.code for a in compute_alerts(h, WatchdogThresholds(**th) if th else None)}


def test_length_collapse_fires_below_half_the_earlier_peak():
    # Vanilla-like: ≈3000 → ≈1100 (ratio 0.37).
    h = {"response_length/mean": series([3000] * 20 + [1100] * 10)}
    alerts = compute_alerts(h)
    assert [a.code for a in alerts] == ["response_length_collapse"]
    a = alerts[0]
    assert a.step == 30 and a.value == pytest.approx(1100 / 3000) and a.collapse
    assert "response_length/mean" in a.message and "37%" in a.message


def test_moderate_shrinking_and_short_histories_do_not_fire():
    # Turn-Discount-like: −23 % is not a collapse.
    assert not codes({"response_length/mean": series([2192] * 20 + [1678] * 10)})
    assert not codes({"response_length/mean": series([3000] * 5 + [100] * 10)})  # < 2 windows
    assert not codes({})


def test_resumed_runs_use_the_last_value_per_step():
    h = {"response_length/mean": series([3000] * 20 + [1000] * 10)}
    relogged = {"response_length/mean": h["response_length/mean"] + series([3000] * 10, start=21)}
    assert "response_length_collapse" in codes(h)
    assert not codes(relogged)


def test_saturated_groups_from_the_saturation_diagnostics():
    fail = series([0.5] * 5 + [0.9] * 10)
    succ = series([0.1] * 5 + [0.1] * 10)
    assert codes({"saturation/frac_all_fail": fail, "saturation/frac_all_success": succ}) == {"saturated_groups"}
    # One step with signal at the end resets the streak.
    assert not codes({"saturation/frac_all_fail": fail + [(16, 0.2)], "saturation/frac_all_success": succ})
    assert not codes({"saturation/frac_all_fail": fail, "saturation/frac_all_success": succ}, saturated_steps=11)


def test_saturated_groups_from_zero_advantages():
    h = {
        "critic/advantages/max": series([1.0] * 3 + [0.0] * 10),
        "critic/advantages/min": series([-1.0] * 3 + [0.0] * 10),
    }
    alerts = compute_alerts(h)
    assert [a.code for a in alerts] == ["saturated_groups"] and alerts[0].value == 10


def test_val_eval_gap_uses_the_latest_validation_at_or_before_the_checkpoint():
    h = {
        "val-core/tau2_airline/reward/mean_at_1": [(50, 0.2), (100, 0.8), (150, 0.9)],
        "eval/pass_hat_k/1": [(100, 0.125)],
    }
    alerts = compute_alerts(h)
    assert [a.code for a in alerts] == ["val_eval_gap"]
    assert alerts[0].value == pytest.approx(0.8 - 0.125) and not alerts[0].collapse
    assert not codes({**h, "eval/pass_hat_k/1": [(100, 0.6)]})
    assert not codes({**h, "eval/pass_hat_k/1": [(10, 0.0)]})  # no validation before step 10


def test_early_stop_only_when_configured_and_only_for_collapses():
    collapse = compute_alerts({"response_length/mean": series([3000] * 20 + [500] * 10)})
    gap = compute_alerts({"val/reward/mean": [(1, 0.9)], "eval/pass_hat_k/1": [(1, 0.1)]})
    assert should_stop(collapse, True) and not should_stop(collapse, False)
    assert gap and not should_stop(gap, True)


def test_watched_keys():
    keys = [
        "response_length/mean",
        "actor/pg_loss",
        "val-core/x/reward/mean_at_4",
        "eval/pass_hat_k/1",
        "saturation/frac_all_fail",
        "critic/advantages/max",
    ]
    assert watched_metric_keys(keys) == sorted(set(keys) - {"actor/pg_loss"})
