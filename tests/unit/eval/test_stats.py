"""longhaul.eval.stats: outcomes, rates, bootstrap, the exact sign-flip test, flip rates (issue 14 items 3, 6;
issue 29 item 1).

The arm comparison and verdicts are in test_stats_arms.py, power and the design file in test_stats_planning.py; the
simulation-based calibration in test_stats_calibration.py and tests/unit/tracking/test_compare_calibration.py."""

from __future__ import annotations

import json
import math
import random
from statistics import NormalDist

import numpy as np
import pytest
from scipy.stats import t as student_t

from longhaul.eval.metrics import TrialRecord, build_task_counts, compute_rate, pass_at_k, pass_hat_k
from longhaul.eval.stats import (
    Outcomes,
    bootstrap_ci,
    cell_values,
    flip_rate,
    paired_difference,
    permutation_p_value,
    rate,
    sign_flip_p_value,
    signflip,
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
    f = student_t.ppf(0.975, 29) / NormalDist().inv_cdf(0.975)
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


# ---------------------------------------------------------------------------------------------------------
# Paired difference


def test_paired_difference_uses_common_tasks_only():
    a = Outcomes(("1", "2", "3"), (0,), np.array([[[1, 0], [0, 0], [1, 1]]], dtype=bool))
    b = Outcomes(("2", "3", "4"), (0, 1), np.array([[[1, 1], [1, 1], [0, 0]], [[1, 0], [1, 1], [0, 0]]], dtype=bool))
    r = paired_difference(a, b, 1, "pass_hat", np.random.default_rng(0), samples=500)
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
    assert permutation_p_value(o, o) == 1.0
    better = Outcomes.from_array(o.data | (np.random.default_rng(4).random((1, 50, 4)) < 0.5))
    r = paired_difference(o, better, 1, "pass_hat", np.random.default_rng(0))
    assert r.p_value < 0.001 and r.ci[0] > 0


def _exhaustive_p(d: np.ndarray) -> float:
    """P(|Σ ±d_t| ≥ |Σ d_t|) over all 2^T sign patterns, enumerated."""
    signs = np.array([[1 - 2 * ((i >> j) & 1) for j in range(d.size)] for i in range(2**d.size)])
    return float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))


@pytest.mark.parametrize(("seeds_a", "seeds_b", "samples"), [(1, 1, 2), (3, 2, 4), (2, 2, 1)])
def test_sign_flip_p_value_is_the_exhaustive_enumeration(seeds_a, seeds_b, samples):
    # 9 tasks: all 512 sign patterns, ties counted as reaching the observed sum; exact, not a Monte Carlo draw.
    rng = np.random.default_rng(seeds_a * 10 + seeds_b)
    for _ in range(20):
        a = Outcomes.from_array(rng.random((seeds_a, 9, samples)) < 0.4)
        b = Outcomes.from_array(rng.random((seeds_b, 9, samples)) < 0.6)
        d = cell_values(b).mean(axis=0) - cell_values(a).mean(axis=0)
        assert permutation_p_value(a, b) == pytest.approx(_exhaustive_p(d), abs=1e-12)


def test_sign_flip_p_value_is_deterministic_and_never_below_its_floor():
    # The old test broke ties with one fixed random draw: one task with any difference got p = 0.013.
    one = Outcomes.from_array(np.array([[[True, True]]])), Outcomes.from_array(np.array([[[False, False]]]))
    assert permutation_p_value(*one) == 1.0  # 1 task: both sign patterns reach |d|
    assert permutation_p_value(one[1], one[0]) == 1.0
    five_a = Outcomes.from_array(np.zeros((1, 5, 4), dtype=bool))
    five_b = Outcomes.from_array(np.ones((1, 5, 4), dtype=bool))
    assert permutation_p_value(five_a, five_b) == 2 / 2**5  # every task moved the same way: the floor 2/2^T
    assert sign_flip_p_value(np.array([3, -1, 0, 2])) == pytest.approx(_exhaustive_p(np.array([3.0, -1, 0, 2])))


def test_sign_flip_p_value_holds_its_size_exactly_under_exchangeable_arms():
    # Under H0 with per-task noise only, P(p ≤ α) ≤ α for every α: the exact distribution over all arms drawn.
    rng = np.random.default_rng(11)
    ps = []
    for _ in range(3000):
        p = rng.random(12)
        a = Outcomes.from_array(rng.random((1, 12, 2)) < p[None, :, None])
        b = Outcomes.from_array(rng.random((1, 12, 2)) < p[None, :, None])
        ps.append(permutation_p_value(a, b))
    ps = np.array(ps)
    for alpha in (0.01, 0.05, 0.1, 0.2):
        assert np.mean(ps <= alpha) <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / ps.size), alpha


def test_large_lattices_use_the_normal_approximation_of_the_same_distribution(monkeypatch):
    rng = np.random.default_rng(12)
    m = rng.integers(-40, 41, 200)
    m[0] += 60
    exact = sign_flip_p_value(m)
    monkeypatch.setattr(signflip, "EXACT_LIMIT", 10)
    assert sign_flip_p_value(m) == pytest.approx(exact, abs=2e-3)
    assert 0.001 < exact < 0.9


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
