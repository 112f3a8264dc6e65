"""Calibration of longhaul.eval.stats on synthetic outcomes with a known truth (issue 14, item 6).

Generator (`_arm`): T tasks with logit difficulty μ_t ~ N(m, τ²) (heterogeneous tasks), each seed adds a
seed-wide shift a_s ~ N(0, σ_a²) and a seed × task shift b_st ~ N(0, σ_b²), and each of the N samples of a
cell is Bernoulli(expit(μ_t + δ + a_s + b_st)). Tasks and seeds are drawn afresh in every simulation, so the
estimand is the population value: pass^1 = E[expit(m + δ + √(τ² + σ_a² + σ_b²)·Z)], computed by 200-point
Gauss–Hermite quadrature (exact to ~1e-12; `test_truth_by_quadrature_matches_a_large_simulation` checks it
against 4 million draws). The paired difference's truth is the difference of two such integrals.

Power is simulated from the planning model itself (`_planning_arms`, see `stats.difference_variance`) and
compared with `stats.power`. Every simulation uses fixed seeds; nothing is timed. Measured values (this
file's seeds) are in the comments next to each bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from longhaul.eval.stats import (
    Outcomes,
    bootstrap_ci,
    cell_values,
    paired_difference,
    permutation_p_value,
    power,
)

pytestmark = pytest.mark.slow

SIMS_COVERAGE = 2000  # SE of a 95% coverage: 0.49 points; the 93–97% band is ±4.1 SE
SIMS_FPR = 2000  # SE of a 5% rate: 0.49 points; the 3.5–6.5% band is ±3.1 SE
SIMS_POWER = 1000  # SE of a simulated power ≤ 1.6 points; the ±5-point band is ≥ 3.1 SE


def _expit(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-x))


def _truth(m: float, sd: float) -> float:
    """E[expit(m + sd·Z)], Z ~ N(0, 1), by Gauss–Hermite quadrature."""
    x, w = np.polynomial.hermite.hermgauss(200)
    return float((w * _expit(m + sd * math.sqrt(2) * x)).sum() / math.sqrt(math.pi))


def _arm(
    rng: np.random.Generator, mu: np.ndarray, seeds: int, samples: int, sa: float, sb: float, delta: float = 0.0
) -> Outcomes:
    a = rng.normal(0.0, sa, (seeds, 1))
    b = rng.normal(0.0, sb, (seeds, mu.size))
    p = _expit(mu[None, :] + delta + a + b)
    return Outcomes.from_array(rng.random((seeds, mu.size, samples)) < p[:, :, None])


def _naive_ci(o: Outcomes, rng: np.random.Generator, reps: int = 2000) -> tuple[float, float]:
    """Deliberately wrong: average the seeds per task, bootstrap tasks only (ignores seed-wide shifts)."""
    x = cell_values(o).mean(axis=0)
    means = x[rng.integers(0, x.size, size=(reps, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(lo), float(hi)


def _pigeonhole_paired_ci(a: Outcomes, b: Outcomes, rng: np.random.Generator, reps: int = 2000) -> tuple[float, float]:
    """Deliberately wrong: redraw whole cells (tasks, and seeds per arm) and average the drawn cells — counts
    the cell noise in the task margins, the seed margins and the cells themselves."""
    va, vb = cell_values(a), cell_values(b)
    t = va.shape[1]

    def counts(m: int) -> np.ndarray:
        idx = rng.integers(0, m, (reps, m)) + (np.arange(reps) * m)[:, None]
        return np.bincount(idx.ravel(), minlength=reps * m).reshape(reps, m)

    tw = counts(t)

    def arm(v: np.ndarray) -> np.ndarray:
        return ((counts(v.shape[0]) @ v) * tw).sum(axis=1) / (v.shape[0] * t)

    lo, hi = np.quantile(arm(vb) - arm(va), [0.025, 0.975])
    return float(lo), float(hi)


def test_truth_by_quadrature_matches_a_large_simulation():
    rng = np.random.default_rng(0)
    draws = _expit(-1.0 + math.sqrt(1.5**2 + 0.2**2 + 0.5**2) * rng.standard_normal(4_000_000))
    assert abs(draws.mean() - _truth(-1.0, math.sqrt(1.5**2 + 0.2**2 + 0.5**2))) < 4 * draws.std() / 2000


# ---------------------------------------------------------------------------------------------------------
# Coverage of one arm's pass^1


def _coverage_one_arm(
    seed: int, tasks: int, seeds: int, samples: int, sa: float, sb: float, m: float = -1.0, tau: float = 1.5
) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    truth = _truth(m, math.sqrt(tau**2 + sa**2 + sb**2))
    hier = naive = 0
    for _ in range(SIMS_COVERAGE):
        o = _arm(rng, rng.normal(m, tau, tasks), seeds, samples, sa, sb)
        lo, hi = bootstrap_ci(o, 1, "pass_hat", rng)
        hier += lo <= truth <= hi
        lo, hi = _naive_ci(o, rng)
        naive += lo <= truth <= hi
    return hier / SIMS_COVERAGE, naive / SIMS_COVERAGE


def test_one_arm_ci_covers_with_three_seeds_and_a_seed_wide_shift():
    # σ_a = 0.15 on the logit scale: whole seeds ~3 points of pass^1 apart. Stronger shifts with 3 seeds
    # cover less (σ_a = 0.3: ~0.93): 2 degrees of freedom cannot pin a seed-wide variance.
    hier, _ = _coverage_one_arm(1, tasks=50, seeds=3, samples=4, sa=0.15, sb=0.5)
    assert 0.93 <= hier <= 0.97, hier  # measured 0.9485 (0.938–0.958 over generator seeds 1–4)


def test_one_arm_ci_covers_with_one_seed():
    hier, naive = _coverage_one_arm(2, tasks=50, seeds=1, samples=4, sa=0.0, sb=0.5)
    assert 0.93 <= hier <= 0.97, hier  # measured 0.9545
    assert abs(hier - naive) < 0.02  # one seed: the hierarchical bootstrap is the task bootstrap (+ t/z)


def test_teeth_a_task_only_ci_under_covers_when_seeds_differ():
    hier, naive = _coverage_one_arm(3, tasks=50, seeds=3, samples=4, sa=0.5, sb=0.5)
    assert naive < 0.88, naive  # measured 0.781
    assert hier - naive > 0.07, (hier, naive)  # measured 0.9205 (3 seeds cannot pin a strong seed shift)


# ---------------------------------------------------------------------------------------------------------
# Coverage of a paired difference with a known effect


def _coverage_paired(seed: int, seeds: int, sa: float, delta: float, pigeonhole: bool = False) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    m, tau, sb = -1.0, 1.5, 0.5
    sd = math.sqrt(tau**2 + sa**2 + sb**2)
    truth = _truth(m + delta, sd) - _truth(m, sd)
    hit = wrong = 0
    for _ in range(SIMS_COVERAGE):
        mu = rng.normal(m, tau, 50)
        a, b = _arm(rng, mu, seeds, 4, sa, sb), _arm(rng, mu, seeds, 4, sa, sb, delta)
        lo, hi = paired_difference(a, b, 1, "pass_hat", rng, permutations=100).ci
        hit += lo <= truth <= hi
        if pigeonhole:
            lo, hi = _pigeonhole_paired_ci(a, b, rng)
            wrong += lo <= truth <= hi
    return hit / SIMS_COVERAGE, wrong / SIMS_COVERAGE


def test_paired_ci_covers_a_known_effect_with_one_seed():
    cov, _ = _coverage_paired(4, seeds=1, sa=0.0, delta=0.4)  # truth +6.5 points
    assert 0.93 <= cov <= 0.97, cov  # measured 0.951


def test_paired_ci_covers_a_known_effect_with_three_seeds_per_arm_and_seed_shifts():
    cov, _ = _coverage_paired(5, seeds=3, sa=0.15, delta=0.4)
    assert 0.93 <= cov <= 0.97, cov  # measured 0.951


def test_teeth_redrawing_cells_over_covers_a_paired_difference():
    cov, pig = _coverage_paired(6, seeds=3, sa=0.0, delta=0.4, pigeonhole=True)
    assert pig > 0.985, pig  # measured 0.9935: the cell noise counted three times (ours: 0.957)
    assert cov < pig


# ---------------------------------------------------------------------------------------------------------
# False positives of the paired permutation test


def _false_positive_rate(seed: int, seeds: int, sa: float, sims: int = SIMS_FPR) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        mu = rng.normal(-1.0, 1.5, 50)
        a, b = _arm(rng, mu, seeds, 4, sa, 0.5), _arm(rng, mu, seeds, 4, sa, 0.5)
        hits += permutation_p_value(a, b, 1, "pass_hat", rng, 1000) < 0.05
    return hits / sims


def test_permutation_test_false_positive_rate_one_seed():
    fpr = _false_positive_rate(7, seeds=1, sa=0.0)
    assert 0.035 <= fpr <= 0.065, fpr  # measured 0.0545


def test_permutation_test_false_positive_rate_three_seeds():
    fpr = _false_positive_rate(8, seeds=3, sa=0.0)
    assert 0.035 <= fpr <= 0.065, fpr  # measured 0.051


def test_documented_limit_a_seed_wide_shift_fools_a_one_seed_comparison_but_not_the_verdict_rule():
    # One seed per arm: a whole-run shift looks like an effect to any test (module docstring).
    assert _false_positive_rate(9, seeds=1, sa=0.3, sims=500) > 0.15  # measured 0.306
    # Three seeds per arm: the permutation test alone is still fooled, p < α AND a CI excluding 0 is not.
    rng = np.random.default_rng(10)
    perm = both = 0
    for _ in range(SIMS_COVERAGE):
        mu = rng.normal(-1.0, 1.5, 50)
        r = paired_difference(
            _arm(rng, mu, 3, 4, 0.3, 0.5), _arm(rng, mu, 3, 4, 0.3, 0.5), 1, "pass_hat", rng, permutations=1000
        )
        perm += r.p_value < 0.05
        both += r.p_value < 0.05 and (r.ci[0] > 0 or r.ci[1] < 0)
    assert perm / SIMS_COVERAGE > 0.15  # measured 0.267
    # Near α, not at it: with 3 seeds and this strong a shift (σ_a = 0.3) the CI itself covers ~93%.
    assert both / SIMS_COVERAGE < 0.10, both / SIMS_COVERAGE  # measured 0.078


# ---------------------------------------------------------------------------------------------------------
# Predicted against simulated power


def _planning_arms(
    rng: np.random.Generator, tasks: int, seeds: int, samples: int, baseline: float, f: float, fw: float, delta: float
) -> tuple[Outcomes, Outcomes]:
    """The model `stats.difference_variance` assumes: task success probabilities p_t from a two-point
    distribution with mean `baseline` and E[p(1−p)] = f/2; seed s adds u_st = ±σ_u, σ_u² = (f − fw)/2;
    arm B adds δ to every probability; samples are Bernoulli."""
    su = math.sqrt((f - fw) / 2)
    var_p = baseline * (1 - baseline) - f / 2
    lo = su
    gap = (baseline - lo) + var_p / (baseline - lo)
    q = (baseline - lo) / gap
    p = np.where(rng.random(tasks) < q, lo + gap, lo)
    arms = []
    for shift in (0.0, delta):
        pst = p[None, :] + shift + su * np.where(rng.random((seeds, tasks)) < 0.5, 1.0, -1.0)
        assert pst.min() >= -1e-12 and pst.max() <= 1 + 1e-12
        arms.append(Outcomes.from_array(rng.random((seeds, tasks, samples)) < pst[:, :, None]))
    return arms[0], arms[1]


@pytest.mark.parametrize(
    ("seed", "tasks", "seeds", "samples", "baseline", "f", "fw", "delta"),
    [
        (11, 50, 1, 4, 0.175, 0.16, 0.16, 0.065),  # the original ablation: 50 tasks × 4 samples, one seed, +6.5
        (12, 50, 1, 1, 0.175, 0.16, 0.16, 0.10),  # single runs
        (13, 50, 3, 4, 0.30, 0.30, 0.26, 0.05),  # three seeds per arm with a seed × task component
    ],
)
def test_predicted_power_matches_simulated_power(seed, tasks, seeds, samples, baseline, f, fw, delta):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(SIMS_POWER):
        a, b = _planning_arms(rng, tasks, seeds, samples, baseline, f, fw, delta)
        hits += permutation_p_value(a, b, 1, "pass_hat", rng, 1000) < 0.05
    simulated = hits / SIMS_POWER
    predicted = power(delta, tasks, samples, seeds, baseline, f, within_flip_rate=fw)
    assert abs(simulated - predicted) <= 0.05, (
        simulated,
        predicted,
    )  # simulated/predicted 0.524/0.510, 0.291/0.316, 0.424/0.431
