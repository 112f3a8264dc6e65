"""longhaul.eval.stats: outcomes, rates, bootstrap, paired test, flip rates, power, verdict (issue 14 items 3, 4, 6).

The simulation-based calibration (coverage, false positives, power) is in test_stats_calibration.py."""

from __future__ import annotations

import json
import math
import random
from statistics import NormalDist

import numpy as np
import pytest

from longhaul.eval.metrics import TrialRecord, build_task_counts, compute_rate, pass_at_k, pass_hat_k
from longhaul.eval.stats import (
    ALPHA,
    DEFAULT_BASELINE,
    DEFAULT_FLIP_RATE,
    POWER,
    Outcomes,
    PairedResult,
    StudyDesign,
    bootstrap_ci,
    cell_values,
    difference_variance,
    flip_rate,
    mde,
    paired_difference,
    permutation_p_value,
    power,
    rate,
    required_design,
    t_quantile,
    verdict,
    within_seed_flip_rate,
)


def _records(rng: random.Random, tasks: list[str], seeds: list[int], n: int) -> list[tuple[int, str, int, bool]]:
    out = []
    for s in seeds:
        for t in tasks:
            p = rng.random()
            out += [(s, t, j, rng.random() < p) for j in range(n)]
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------------------------------------------------
# Outcomes


def test_from_records_orders_tasks_like_metrics_and_samples_by_trial():
    recs = [
        (1, "10", 1, False),
        (1, "10", 0, True),
        (1, "2", 0, False),
        (1, "2", 1, True),
        (0, "10", 0, False),
        (0, "10", 1, False),
        (0, "2", 1, True),
        (0, "2", 0, True),
    ]
    o = Outcomes.from_records(recs)
    assert o.tasks == ("2", "10") and o.seeds == (0, 1) and o.samples == 2
    assert o.data.tolist() == [[[True, True], [False, False]], [[False, True], [True, False]]]
    with pytest.raises(ValueError):
        o.data[0, 0, 0] = False  # frozen all the way down


def test_duplicate_record_is_refused_with_seed_task_and_trial():
    with pytest.raises(ValueError, match=r"duplicate record: seed 2 task '7' trial 1"):
        Outcomes.from_records([(2, "7", 0, True), (2, "7", 1, True), (2, "7", 1, False)])


def test_task_missing_under_one_seed_is_named():
    recs = [(0, "a", 0, True), (0, "b", 0, True), (1, "a", 0, False)]
    with pytest.raises(ValueError, match=r"ragged design: seed 1 has no records for 1 task\(s\).*'b'"):
        Outcomes.from_records(recs)


def test_cell_with_other_sample_count_is_named():
    recs = [(0, "1", j, True) for j in range(4)] + [(0, "2", j, True) for j in (0, 1, 3)]
    recs += [(0, "3", j, False) for j in range(4)]
    with pytest.raises(
        ValueError, match=r"seed 0 task '2' has 3 samples \(trials \[0, 1, 3\]\), the other cells have 4"
    ):
        Outcomes.from_records(recs)


def test_outcomes_constructor_checks_shape_and_dtype():
    with pytest.raises(ValueError, match="bool"):
        Outcomes(("a",), (0,), np.zeros((1, 1, 2)))
    with pytest.raises(ValueError, match="2 tasks"):
        Outcomes(("a", "b"), (0,), np.zeros((1, 1, 2), dtype=bool))
    with pytest.raises(ValueError, match="no records"):
        Outcomes.from_records([])


# ---------------------------------------------------------------------------------------------------------
# Rates


@pytest.mark.parametrize("kind", ["pass_hat", "pass_at"])
def test_rate_equals_compute_rate_exactly_for_one_seed(kind):
    rng = random.Random(3)
    tasks = [str(i) for i in range(37)] + ["x", "y"]
    recs = _records(rng, tasks, [0], 8)
    o = Outcomes.from_records(recs)
    counts = build_task_counts([TrialRecord(t, j, ok) for _, t, j, ok in recs])
    for k in (1, 2, 4, 8):
        assert rate(o, k, kind) == compute_rate(counts, k, kind)  # to the bit


def test_rate_over_seeds_is_the_mean_of_per_seed_rates_and_cells_match_metrics():
    rng = random.Random(4)
    recs = _records(rng, [str(i) for i in range(20)], [0, 1, 2], 4)
    o = Outcomes.from_records(recs)
    per_seed = []
    for s in (0, 1, 2):
        counts = build_task_counts([TrialRecord(t, j, ok) for ss, t, j, ok in recs if ss == s])
        per_seed.append(compute_rate(counts, 2, "pass_hat"))
    assert rate(o, 2) == pytest.approx(sum(per_seed) / 3, abs=1e-15)
    v = cell_values(o, 2, "pass_at")
    c = o.data.sum(axis=2)
    assert all(v[s, t] == pass_at_k(int(c[s, t]), 4, 2) for s in range(3) for t in range(20))
    assert cell_values(o, 4)[0, 0] == pass_hat_k(int(c[0, 0]), 4, 4)


def test_rate_argument_checks():
    o = Outcomes.from_array(np.ones((1, 3, 2), dtype=bool))
    with pytest.raises(ValueError, match="1 ≤ k ≤ n"):
        rate(o, 3)
    with pytest.raises(ValueError, match="valid: pass_hat, pass_at"):
        rate(o, 1, "pass^1")


# ---------------------------------------------------------------------------------------------------------
# Bootstrap


def test_one_seed_bootstrap_is_the_task_bootstrap_widened_by_t_over_z():
    o = Outcomes.from_array(np.random.default_rng(0).random((1, 30, 4)) < 0.4)
    lo, hi = bootstrap_ci(o, 1, "pass_hat", np.random.default_rng(9), samples=4000)
    x = cell_values(o)[0]
    rng = np.random.default_rng(9)
    reps = x[rng.integers(0, 30, size=(4000, 30), dtype=np.int32)].mean(axis=1)
    plo, phi = np.quantile(reps, [0.025, 0.975])
    g = x.mean()
    f = t_quantile(0.975, 29) / NormalDist().inv_cdf(0.975)
    assert (lo, hi) == pytest.approx((g - f * (g - plo), g + f * (phi - g)), abs=1e-12)


def test_bootstrap_is_reproducible_and_brackets_the_rate():
    o = Outcomes.from_array(np.random.default_rng(1).random((3, 40, 4)) < 0.3)
    a = bootstrap_ci(o, 1, "pass_hat", np.random.default_rng(5))
    assert a == bootstrap_ci(o, 1, "pass_hat", np.random.default_rng(5))
    assert a[0] < rate(o) < a[1]
    const = Outcomes.from_array(np.ones((2, 5, 3), dtype=bool))
    assert bootstrap_ci(const, 2, "pass_hat", np.random.default_rng(0)) == (1.0, 1.0)


def test_seed_wide_shift_widens_the_interval():
    rng = np.random.default_rng(2)
    base = rng.random((1, 50, 4)) < 0.4
    same = Outcomes.from_array(np.repeat(base, 3, axis=0))  # three identical seeds: no seed variance
    shifted = np.repeat(base, 3, axis=0).copy()
    shifted[0, :10] = True  # one seed better on 10 tasks, one worse
    shifted[2, 10:20] = False
    lo0, hi0 = bootstrap_ci(same, 1, "pass_hat", np.random.default_rng(0))
    lo1, hi1 = bootstrap_ci(Outcomes.from_array(shifted), 1, "pass_hat", np.random.default_rng(0))
    assert hi1 - lo1 > 1.5 * (hi0 - lo0)


def test_t_quantile_matches_tables():
    for q, df, want in [
        (0.975, 1, 12.706205),
        (0.975, 2, 4.302653),
        (0.975, 10, 2.228139),
        (0.95, 30, 1.697261),
        (0.025, 5, -2.570582),
        (0.5, 3, 0.0),
    ]:
        assert t_quantile(q, df) == pytest.approx(want, abs=1e-6)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.959964, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Paired difference


def test_paired_difference_uses_common_tasks_only():
    a = Outcomes(("1", "2", "3"), (0,), np.array([[[1, 0], [0, 0], [1, 1]]], dtype=bool))
    b = Outcomes(("2", "3", "4"), (0, 1), np.array([[[1, 1], [1, 1], [0, 0]], [[1, 0], [1, 1], [0, 0]]], dtype=bool))
    r = paired_difference(a, b, 1, "pass_hat", np.random.default_rng(0), samples=500, permutations=500)
    assert r.tasks == 2
    assert r.rate_a == 0.5 and r.rate_b == pytest.approx(0.875)
    assert r.diff == pytest.approx(0.375)
    assert 0 < r.p_value <= 1 and r.se > 0 and r.ci[0] <= r.diff <= r.ci[1]
    assert json.loads(json.dumps(r.to_dict()))["ci"] == list(r.ci)


def test_paired_difference_without_common_tasks_is_an_error():
    a = Outcomes.from_records([(0, "1", 0, True)])
    b = Outcomes.from_records([(0, "2", 0, True)])
    with pytest.raises(ValueError, match="no task in common"):
        paired_difference(a, b, 1, "pass_hat", np.random.default_rng(0))


def test_identical_arms_have_p_one_and_a_large_effect_a_small_p():
    o = Outcomes.from_array(np.random.default_rng(3).random((1, 50, 4)) < 0.3)
    assert permutation_p_value(o, o, 1, "pass_hat", np.random.default_rng(0)) == 1.0
    better = Outcomes.from_array(o.data | (np.random.default_rng(4).random((1, 50, 4)) < 0.5))
    r = paired_difference(o, better, 1, "pass_hat", np.random.default_rng(0))
    assert r.p_value < 0.001 and r.ci[0] > 0


def test_permutation_p_value_by_exhaustive_enumeration():
    # 8 tasks: the 2^8 sign patterns give the exact p; the Monte Carlo p is within its binomial noise.
    rng = np.random.default_rng(6)
    a = Outcomes.from_array(rng.random((1, 8, 2)) < 0.5)
    b = Outcomes.from_array(rng.random((1, 8, 2)) < 0.7)
    d = cell_values(b)[0] - cell_values(a)[0]
    signs = np.array([[1 - 2 * ((i >> j) & 1) for j in range(8)] for i in range(256)])
    perm = np.abs(signs @ d) / 8
    obs = abs(d.mean())
    exact_ge = np.mean(perm >= obs - 1e-12)
    exact_gt = np.mean(perm > obs + 1e-12)
    ps = [permutation_p_value(a, b, 1, "pass_hat", np.random.default_rng(i), 4000) for i in range(20)]
    assert exact_gt - 0.02 < np.mean(ps) < exact_ge + 0.02


# ---------------------------------------------------------------------------------------------------------
# Flip rates


def test_flip_rate_by_hand():
    data = np.array(
        [
            [[1, 1], [0, 0]],  # seed 0: task a 2/2, task b 0/2
            [[0, 1], [0, 0]],  # seed 1: task a 1/2, task b 0/2
        ],
        dtype=bool,
    )
    o = Outcomes.from_array(data)
    # task a: pairs (1,0),(1,1),(1,0),(1,1) → 2 of 4 differ; task b: none → mean 0.25
    assert flip_rate(o) == 0.25
    # within a seed: task a seed 1 disagrees (1 of 1 pair), every other cell agrees → 1/4
    assert within_seed_flip_rate(o) == 0.25
    assert flip_rate(Outcomes.from_array(data[:1])) is None
    assert within_seed_flip_rate(Outcomes.from_array(data[:, :, :1])) is None


def test_flip_rate_one_sample_is_the_fraction_of_differing_outcomes_averaged_over_seed_pairs():
    data = np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 0, 1, 1]], dtype=bool)[:, :, None]
    o = Outcomes.from_array(data)
    pairs = [(0, 1), (0, 2), (1, 2)]
    want = np.mean([np.mean(data[i, :, 0] != data[j, :, 0]) for i, j in pairs])
    assert flip_rate(o) == pytest.approx(want)
    c = np.array([[1, 0, 1, 1]], dtype=bool)[:, :, None]
    assert within_seed_flip_rate(Outcomes.from_array(np.array([[[1, 0, 1, 0]]], dtype=bool))) == pytest.approx(2 / 3)
    assert flip_rate(Outcomes.from_array(np.repeat(c, 2, axis=0))) == 0.0


# ---------------------------------------------------------------------------------------------------------
# Power


def test_defaults_reproduce_the_noise_floor_they_come_from():
    # τ² issue #540: two single runs (1 sample per task) on 50 tasks must differ by ~11 points at the upper end.
    sd = math.sqrt(difference_variance(0.0, 50, 1, 1, DEFAULT_BASELINE, DEFAULT_FLIP_RATE) / 50)
    assert NormalDist().inv_cdf(0.975) * sd == pytest.approx(0.11, abs=0.002)
    assert (ALPHA, POWER) == (0.05, 0.8)


def test_variance_model_by_hand():
    # V = [(f − f_w) + (f_w + δ(1 − 2b) − δ² − σ²)/N]/S + σ²
    v = difference_variance(0.1, 50, 4, 2, 0.3, 0.3, within_flip_rate=0.2, effect_sd=0.05)
    assert v == pytest.approx(((0.3 - 0.2) + (0.2 + 0.1 * 0.4 - 0.01 - 0.0025) / 4) / 2 + 0.0025)
    assert difference_variance(0.0, 50, 4, 3, 0.3, 0.3) == pytest.approx(0.3 / 12)


def test_power_is_alpha_at_no_effect_and_grows_with_effect_tasks_samples_and_seeds():
    assert power(0.0, 50, 4, 1) == pytest.approx(ALPHA)
    by_effect = [power(d, 50, 4, 1) for d in (0.02, 0.05, 0.1, 0.2)]
    assert by_effect == sorted(by_effect) and by_effect[-1] > 0.99
    assert power(0.065, 100, 4, 1) > power(0.065, 50, 4, 1) > power(0.065, 10, 4, 1)
    assert power(0.065, 50, 8, 1) > power(0.065, 50, 4, 1)
    assert power(0.065, 50, 4, 3) > power(0.065, 50, 4, 1)
    assert power(-0.065, 50, 4, 1) > 0.3  # two-sided


def test_mde_and_power_are_inverse_and_mde_shrinks_with_the_design():
    for design in [(50, 4, 1), (50, 1, 1), (10, 4, 1), (50, 4, 3), (200, 2, 2)]:
        m = mde(*design)
        assert power(m, *design) == pytest.approx(POWER, abs=1e-6)
        assert power(m * 0.9, *design) < POWER
    assert mde(50, 4, 3) < mde(50, 4, 1) < mde(50, 1, 1)
    assert mde(50, 4, 1, power=0.9) > mde(50, 4, 1)
    assert mde(50, 4, 1, flip_rate=0.05) < mde(50, 4, 1)
    assert mde(3, 4, 1) == math.inf  # the exact sign-flip test cannot reach p < 0.05 with 3 tasks


def test_required_design_trades_seeds_for_samples_and_sees_the_task_bound():
    need = required_design(0.065, 50, 4, 1)
    assert not need.bounded_by_tasks
    assert power(0.065, 50, 4, need.seeds) >= POWER > power(0.065, 50, 4, need.seeds - 1)
    assert power(0.065, 50, need.samples, 1) >= POWER > power(0.065, 50, need.samples - 1, 1)
    assert "seeds per arm at 4 samples per task" in need.describe()
    # A seed × task component (f_w < f) does not shrink with samples: only seeds reach the target.
    capped = required_design(0.065, 50, 4, 1, within_flip_rate=0.10)
    assert capped.samples is None and capped.seeds is not None
    # Effect heterogeneity does not shrink with seeds or samples: the task count bounds it.
    bounded = required_design(0.065, 10, 4, 1, effect_sd=0.15)
    assert bounded.bounded_by_tasks and bounded.power_limit < POWER
    assert "not reachable with 10 tasks" in bounded.describe()
    with pytest.raises(ValueError, match="non-zero"):
        required_design(0.0, 50, 4, 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"flip_rate": 0.5}, "flip_rate"),
        ({"within_flip_rate": 0.3}, "within_flip_rate"),
        ({"baseline": 1.0}, "baseline"),
        ({"seeds": 0}, "seeds"),
        ({"samples": 2.5}, "samples"),
        ({"effect_sd": -0.1}, "effect_sd"),
    ],
)
def test_design_arguments_are_checked(kwargs, field):
    args = {"effect": 0.05, "tasks": 50, "samples": 4, "seeds": 1, "baseline": 0.175, "flip_rate": 0.16}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"^{field}"):
        difference_variance(**args)


# ---------------------------------------------------------------------------------------------------------
# Study design file


def test_study_design_round_trip_and_errors():
    d = StudyDesign(50, 4, 2, 0.175, 0.2, 0.16)
    assert StudyDesign.from_dict(json.loads(d.to_json())) == d
    ok = {"tasks": 50, "samples": 4, "seeds": 1, "baseline": 0.175, "flip_rate": 0.16}
    assert StudyDesign.from_dict(ok).within_flip_rate is None
    for bad, msg in [
        ({**ok, "flip": 1}, "unknown field 'flip'; valid: tasks, samples"),
        ({k: v for k, v in ok.items() if k != "seeds"}, "field 'seeds' is missing"),
        ({**ok, "tasks": "50"}, "field 'tasks': expected a whole number ≥ 1 (got '50')"),
        ({**ok, "samples": True}, "field 'samples'"),
        ({**ok, "baseline": 1.5}, "field 'baseline': expected a number in"),
        ({**ok, "flip_rate": 0.4}, "field 'flip_rate': flip_rate must be in"),
    ]:
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            StudyDesign.from_dict(bad)
    with pytest.raises(ValueError, match="JSON object"):
        StudyDesign.from_dict([1, 2])  # type: ignore[arg-type]


def test_study_design_from_outcomes():
    rng = np.random.default_rng(0)
    p = rng.random(50)
    o = Outcomes.from_array(rng.random((2, 50, 4)) < p[None, :, None])
    d = StudyDesign.from_outcomes(o)
    assert (d.tasks, d.samples, d.seeds, d.baseline) == (50, 4, 2, rate(o))
    assert d.flip_rate == flip_rate(o) and d.within_flip_rate <= d.flip_rate
    one = StudyDesign.from_outcomes(Outcomes.from_array(o.data[:1]))
    assert one.flip_rate == within_seed_flip_rate(Outcomes.from_array(o.data[:1]))
    with pytest.raises(ValueError, match="measures no flip rate"):
        StudyDesign.from_outcomes(Outcomes.from_array(o.data[:1, :, :1]))
    # Two seeds at opposite extremes disagree on everything: clipped to what the planning model allows.
    extreme = StudyDesign.from_outcomes(Outcomes.from_array(np.array([[[1, 1]] * 5, [[0, 0]] * 5], dtype=bool)))
    assert (extreme.baseline, extreme.flip_rate, extreme.within_flip_rate) == (0.5, 0.5, 0.0)
    StudyDesign.from_dict(json.loads(extreme.to_json()))  # valid for `longhaul power --from-comparison`


# ---------------------------------------------------------------------------------------------------------
# Verdict


def _result(diff: float, lo: float, hi: float, p: float) -> PairedResult:
    return PairedResult(
        diff=diff, ci=(lo, hi), p_value=p, tasks=50, se=0.03, rate_a=0.2, rate_b=0.2 + diff, confidence=0.95
    )


def test_verdict_lines():
    assert (
        verdict(_result(0.041, -0.020, 0.103, 0.21), 0.087)
        == "+4.1 points [−2.0, 10.3], p = 0.21, MDE 8.7: not distinguishable from noise"
    )
    assert (
        verdict(_result(0.09, 0.031, 0.152, 0.0042), 0.087, a="vanilla", b="LATA")
        == "+9.0 points [3.1, 15.2], p = 0.0042, MDE 8.7: LATA better than vanilla"
    )
    assert (
        verdict(_result(-0.09, -0.15, -0.03, 0.004), 0.087)
        == "−9.0 points [−15.0, −3.0], p = 0.004, MDE 8.7: A better than B"
    )
    # Both conditions are needed: p < α with a CI over 0 (a seed-wide shift widened it), and the reverse.
    assert verdict(_result(0.06, -0.01, 0.13, 0.03), 0.087).endswith(": not distinguishable from noise")
    assert verdict(_result(0.06, 0.001, 0.12, 0.06), 0.087).endswith(": not distinguishable from noise")
    assert "MDE n/a" in verdict(_result(0.06, 0.001, 0.12, 0.06), math.inf)


def test_arm_outcomes_leave_out_a_task_unscored_in_any_seed():
    """The study keeps a rectangular design: a task with an endpoint-error trial in one seed leaves every seed."""
    from longhaul.eval.metrics import TrialRecord
    from longhaul.tracking.study import Arm, SeedEval, arm_outcomes

    def recs(bad: bool) -> tuple[TrialRecord, ...]:
        out = [TrialRecord(t, j, j == 0) for t in ("1", "2") for j in range(2)]
        if bad:
            out[3] = TrialRecord("2", 1, False, termination="endpoint_error", scored=False)
        return tuple(out)

    arm = Arm(
        "a",
        "a",
        "grpo",
        (SeedEval(1, "r1", 2, "last evaluated", recs(False)), SeedEval(2, "r2", 2, "last evaluated", recs(True))),
    )
    o = arm_outcomes(arm)
    assert list(o.tasks) == ["1"] and list(o.seeds) == [1, 2]
