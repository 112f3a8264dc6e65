"""longhaul.eval.stats: the verdict's test between configurations (`compare_arms`: tasks and training seeds as
variance components), Holm's correction and the verdict lines (issue 29 items 1, 2, 4, 5).

Its error rates on simulated studies are measured through `build_statistics` in
tests/unit/tracking/test_compare_calibration.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from longhaul.eval.stats import (
    DEFAULT_SEED_SD,
    ArmComparison,
    DesignNeed,
    Outcomes,
    SeedNoise,
    cell_values,
    compare_arms,
    holm,
    permutation_p_value,
    verdict,
)


def _arm(rng: np.random.Generator, p: np.ndarray, seeds: int, samples: int = 4, shift: float = 0.0) -> Outcomes:
    q = np.clip(p[None, :] + shift + rng.normal(0, 0.05, (seeds, 1)), 0, 1)
    return Outcomes.from_array(rng.random((seeds, p.size, samples)) < q[:, :, None])


# ---------------------------------------------------------------------------------------------------------
# The test


def test_variance_components_and_the_t_test_by_hand():
    rng = np.random.default_rng(1)
    p = rng.random(20)
    a, b = _arm(rng, p, 3), _arm(rng, p, 2, shift=0.1)
    r = compare_arms(a, b)
    va, vb = cell_values(a), cell_values(b)
    d = vb.mean(axis=0) - va.mean(axis=0)
    # seed margins and residuals, pooled over both arms: df_α = 2 + 1, df_γ = (2 + 1)·19
    ss_a = ss_g = 0.0
    for v in (va, vb):
        alpha = v.mean(axis=1) - v.mean()
        resid = v - v.mean(axis=1, keepdims=True) - v.mean(axis=0, keepdims=True) + v.mean()
        ss_a, ss_g = ss_a + (alpha**2).sum(), ss_g + (resid**2).sum()
    ms_a, ms_g = ss_a / 3, ss_g / (3 * 19)
    seed_var = max(0.0, ms_a - ms_g / 20)
    c = 1 / 3 + 1 / 2
    v_task = d.var(ddof=1) / 20
    v = v_task + c * seed_var
    den = v_task**2 / 19 + ((c * ms_a) ** 2 / 3 + (c * ms_g / 20) ** 2 / 57 if seed_var > 0 else 0.0)
    df = v * v / den
    assert r.seed_sd_measured and r.seed_sd == pytest.approx(math.sqrt(seed_var))
    assert (r.se, r.df) == pytest.approx((math.sqrt(v), df))
    assert r.p_t == pytest.approx(2 * student_t.sf(abs(r.diff) / r.se, df))
    half = student_t.ppf(0.975, df) * r.se
    assert r.ci == pytest.approx((r.diff - half, r.diff + half))
    assert r.diff == pytest.approx(d.mean()) and (r.tasks, r.seeds_a, r.seeds_b) == (20, 3, 2)
    assert r.p_value == max(r.p_t, r.p_sign_flip) and r.p_sign_flip == permutation_p_value(a, b)
    assert SeedNoise.pooled([va, vb]).variance == pytest.approx(seed_var)


def test_one_seed_per_arm_takes_the_assumed_seed_sd_as_known():
    rng = np.random.default_rng(2)
    p = rng.random(30)
    a, b = _arm(rng, p, 1), _arm(rng, p, 1, shift=0.08)
    r = compare_arms(a, b)
    d = cell_values(b)[0] - cell_values(a)[0]
    v = d.var(ddof=1) / 30 + 2 * DEFAULT_SEED_SD**2
    assert not r.seed_sd_measured and r.seed_sd == DEFAULT_SEED_SD and not r.testable
    assert r.se == pytest.approx(math.sqrt(v))
    assert r.df == pytest.approx(v * v / ((d.var(ddof=1) / 30) ** 2 / 29))  # the known seed part adds no df term
    wider = compare_arms(a, b, assumed_seed_sd=0.05)
    assert wider.ci[1] - wider.ci[0] > r.ci[1] - r.ci[0] and wider.p_value > r.p_value
    runs_only = compare_arms(a, b, assumed_seed_sd=0.0)
    assert runs_only.ci[1] - runs_only.ci[0] < r.ci[1] - r.ci[0]


def test_a_seed_wide_shift_widens_the_ci_and_the_pooled_estimate_serves_a_one_seed_arm():
    rng = np.random.default_rng(3)
    p = rng.random(40)
    base = rng.random((1, 40, 4)) < p[None, :, None]
    calm = Outcomes.from_array(np.repeat(base, 3, axis=0))
    shifted = np.repeat(base, 3, axis=0).copy()
    shifted[0, :12] = True  # seed 0 better on 12 tasks, seed 2 worse on 12
    shifted[2, 12:24] = False
    b = _arm(rng, p, 3)
    r0, r1 = compare_arms(calm, b), compare_arms(Outcomes.from_array(shifted), b)
    assert r1.seed_sd > r0.seed_sd and r1.ci[1] - r1.ci[0] > 1.2 * (r0.ci[1] - r0.ci[0])
    one = compare_arms(Outcomes.from_array(shifted), _arm(rng, p, 1))
    assert one.seed_sd_measured and not one.testable  # measured on A's 3 seeds, but B has one seed


def test_degenerate_comparisons_stay_finite_and_strict_json():
    one_task = compare_arms(
        Outcomes.from_array(np.zeros((3, 1, 4), dtype=bool)), Outcomes.from_array(np.ones((3, 1, 4), dtype=bool))
    )
    assert (one_task.p_value, one_task.ci) == (1.0, (-1.0, 1.0)) and math.isinf(one_task.se)
    d = one_task.to_dict()
    assert d["se"] is None and d["df"] is None
    json.dumps(d, allow_nan=False)
    same = Outcomes.from_array(np.ones((2, 5, 4), dtype=bool))
    r = compare_arms(same, same)
    assert (r.diff, r.p_value, r.ci) == (0.0, 1.0, (0.0, 0.0))
    json.dumps(r.to_dict(), allow_nan=False)
    # Every task moved alike in every seed: no variance, but the sign-flip floor 2/2^T still holds p up.
    moved = compare_arms(Outcomes.from_array(np.zeros((2, 5, 4), dtype=bool)), same)
    assert moved.p_t == 0.0 and moved.p_value == 2 / 2**5


def test_the_same_runs_give_the_same_numbers():
    rng = np.random.default_rng(4)
    p = rng.random(10)
    a, b = _arm(rng, p, 3), _arm(rng, p, 3, shift=0.05)
    assert compare_arms(a, b) == compare_arms(a, b)


def test_argument_checks():
    o = Outcomes.from_array(np.ones((1, 3, 2), dtype=bool))
    with pytest.raises(ValueError, match="confidence"):
        compare_arms(o, o, confidence=1.5)
    with pytest.raises(ValueError, match="assumed_seed_sd"):
        compare_arms(o, o, assumed_seed_sd=-0.1)
    with pytest.raises(ValueError, match="no task in common"):
        compare_arms(o, Outcomes(("x",), (0,), np.ones((1, 1, 2), dtype=bool)))


# ---------------------------------------------------------------------------------------------------------
# Holm


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 → ×3, ×2, ×1 = 0.03, 0.06, 0.04 → monotone 0.03, 0.06, 0.06
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([0.02]) == [0.02] and holm([]) == []


def test_holm_controls_the_family_wise_error_under_the_global_null():
    rng = np.random.default_rng(5)
    any_rejected = np.mean([min(holm(list(rng.random(6)))) < 0.05 for _ in range(20000)])
    assert any_rejected <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 20000)  # measured 0.0487 (Bonferroni-sized at 6)
    assert any_rejected > 0.04  # and not a correction that never rejects


# ---------------------------------------------------------------------------------------------------------
# Verdict lines


def _result(
    diff: float, lo: float, hi: float, p: float, seeds: tuple[int, int] = (3, 3), tasks: int = 50
) -> ArmComparison:
    return ArmComparison(
        diff=diff,
        ci=(lo, hi),
        p_value=p,
        p_t=p,
        p_sign_flip=p / 10,
        se=0.03,
        df=20.0,
        tasks=tasks,
        seeds_a=seeds[0],
        seeds_b=seeds[1],
        rate_a=0.2,
        rate_b=0.2 + diff,
        seed_sd=0.024,
        seed_sd_measured=max(seeds) > 1,
        confidence=0.95,
    )


def test_verdict_lines_with_seeds():
    better, line = verdict(
        _result(0.09, 0.031, 0.152, 0.0042), p_adjusted=0.0126, mde=0.087, needs=None, a="vanilla", b="LATA"
    )
    assert (better, line) == (
        "LATA",
        "+9.0 points [3.1, 15.2], p = 0.0042 (Holm 0.013), MDE 8.7: LATA better than vanilla",
    )
    better, line = verdict(_result(-0.09, -0.15, -0.03, 0.004), p_adjusted=0.004, mde=0.087, needs=None)
    assert (better, line) == ("A", "−9.0 points [−15.0, −3.0], p = 0.004 (Holm 0.004), MDE 8.7: A better than B")
    # Significant alone, not after Holm: no claim.
    better, line = verdict(_result(0.06, 0.001, 0.12, 0.03), p_adjusted=0.09, mde=None, needs=None)
    assert better is None and line.endswith("(Holm 0.09), MDE n/a: not distinguishable from noise")


def test_one_seed_never_gives_a_verdict_and_names_the_seeds_needed():
    need = DesignNeed(0.2, 0.8, 50, 4, 1, 3, None, 1.0, False)
    better, line = verdict(
        _result(0.2, 0.1, 0.3, 1e-6, seeds=(1, 1)), p_adjusted=1e-6, mde=None, needs=need, a="A", b="B"
    )
    assert better is None
    assert "(seed SD 2.4 points assumed): no verdict — A and B have one seed" in line
    assert line.endswith("+20.0 points at 80% power needs 3 seeds per arm at 4 samples per task")
    better, line = verdict(_result(0.0, -0.1, 0.1, 1.0, seeds=(3, 1)), p_adjusted=1.0, mde=None, needs=None)
    assert better is None and "measured on the other arm's seeds" in line and "B has one seed" in line
    assert line.endswith("no difference seen")


def test_one_task_is_no_test():
    better, line = verdict(_result(0.25, -1, 1, 1.0, tasks=1), p_adjusted=1.0, mde=None, needs=None)
    assert better is None and line.startswith("+25.0 points on 1 task: no test")
