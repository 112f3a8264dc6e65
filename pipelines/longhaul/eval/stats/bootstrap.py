"""Hierarchical-bootstrap CIs (pure; randomness only through an explicit `numpy.random.Generator`): one arm's rate,
and the paired difference of two checkpoints or arms (`paired_difference`, with the exact sign-flip p-value).

    rate CI       tasks resampled with replacement, then seeds with replacement (independently: seeds and tasks
                  are crossed, each seed runs every task); the samples of a cell are kept as they are because
                  v[s, t] is computed from them. Percentile interval of the seed and task margins, widened by
                  t_ν/z for few seeds (`bootstrap_ci` says exactly how and why).
    paired diff   rate(B) − rate(A) on the tasks both arms ran; the bootstrap draws one task resample for both
                  arms and a seed resample per arm. With one seed per arm this is the comparison of two runs
                  (two checkpoints): a seed's luck is part of what is compared, not noise — the verdict of
                  `longhaul compare` uses `longhaul.eval.stats.arms` instead, which models it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy.special import stdtrit

from longhaul.eval.stats.defaults import ALPHA, BOOTSTRAP_SAMPLES
from longhaul.eval.stats.outcomes import Outcomes, TwoWay, cell_values, common_tasks, rate
from longhaul.eval.stats.signflip import permutation_p_value


def _resampled_means(x: np.ndarray, rng: np.random.Generator, reps: int) -> np.ndarray:
    """Means of `reps` resamples of x (with replacement, each of size x.size); vectorised, O(reps · x.size)."""
    if x.size == 1:
        return np.full(reps, float(x[0]))
    return x[rng.integers(0, x.size, size=(reps, x.size), dtype=np.int32)].mean(axis=1)


def _seed_term(m: TwoWay, rng: np.random.Generator, reps: int) -> np.ndarray:
    """Means of resampled seed margins, scaled so that their bootstrap variance is σ̂² / S (`TwoWay.seed_variance`:
    the seed-wide variance with the cell noise taken out, and the S/(S−1) the plain bootstrap loses)."""
    s = m.alpha.size
    if s == 1 or m.seed_variance == 0:
        return np.zeros(reps)
    return math.sqrt(m.seed_variance / m.ms_seed * s / (s - 1)) * _resampled_means(m.alpha, rng, reps)


def _seed_component(m: TwoWay) -> tuple[float, int]:
    """(variance of the seed-wide part of the rate, its degrees of freedom)."""
    return m.seed_variance / m.alpha.size, max(1, m.df_seed)


def _task_component(beta: np.ndarray) -> tuple[float, int]:
    """(variance of the task part of the rate, s²_β / T, and its degrees of freedom T − 1)."""
    t = beta.size
    return (float((beta**2).sum()) / (t - 1) / t, t - 1) if t > 1 else (0.0, 1)


def _interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    lo, hi = np.quantile(stats, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def _widened(stats: np.ndarray, est: float, confidence: float, parts: list[tuple[float, int]]) -> tuple[float, float]:
    """Percentile interval of `stats`, widened about `est` by t_ν/z, ν the Welch–Satterthwaite degrees of freedom
    of the variance components `parts` ((variance, df) pairs)."""
    lo, hi = _interval(stats, confidence)
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts)
    if total <= 0 or denom <= 0:
        return lo, hi
    q = (1 + confidence) / 2
    f = float(stdtrit(total * total / denom, q)) / NormalDist().inv_cdf(q)
    return est - f * (est - lo), est + f * (hi - est)


def _check_reps(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be ≥ 1 (got {value})")


def bootstrap_ci(
    o: Outcomes,
    k: int,
    kind: str,
    rng: np.random.Generator,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = 1 - ALPHA,
) -> tuple[float, float]:
    """CI of `rate` by a hierarchical bootstrap over the crossed seeds × tasks design.

    Each replicate resamples the T tasks with replacement, then the S seeds with replacement (independent
    draws: every seed ran every task). The samples of a cell stay as they are — the cell's value v[s, t] is
    their pass^k — and the table is split into margins, v[s, t] = g + α_s + β_t + γ_st. The replicate is
        g + mean of the drawn tasks' β + c · mean of the drawn seeds' α,   c² = σ̂_a² / s²_α · S/(S−1)
    (`_seed_term`: the seed term gets the seed-wide variance with the cell noise taken out, and the S/(S−1)
    the plain bootstrap loses). The interval is the percentile interval of the replicates, widened about the
    estimate by t_ν / z, ν the Welch–Satterthwaite degrees of freedom of the two variance parts (T − 1 for
    the tasks, S − 1 for the seeds): with 2–3 seeds and a visible seed-wide shift the interval widens as a t
    interval does; without one ν ≈ T − 1 (a factor 1.02 at 50 tasks). Clipped to [0, 1].

    With one seed the replicates are exactly the task bootstrap's: the CI of that run, which a seed's luck is
    not part of. Why margins rather than redrawn cells (the "pigeonhole" bootstrap): redrawing cells counts the
    cell noise γ about three times — it is already in the task and the seed margins — which makes a paired
    difference's CI far too wide; tasks alone (the seed-averaged per-task values) miss seed-wide shifts.
    tests/unit/eval/test_stats_calibration.py measures the coverage of all three against a known truth.
    Vectorised: O(samples · (S + T))."""
    _check_reps("samples", samples)
    m = TwoWay.of(cell_values(o, k, kind))
    stats = m.g + _resampled_means(m.beta, rng, samples) + _seed_term(m, rng, samples)
    lo, hi = _widened(stats, m.g, confidence, [_task_component(m.beta), _seed_component(m)])
    # The widening can step past the range a rate can take; the truth never lies there.
    return max(lo, 0.0), min(hi, 1.0)


@dataclass(frozen=True)
class PairedResult:
    """Arm B minus arm A on the tasks both ran.

    `diff` = rate(B) − rate(A); `ci` its hierarchical-bootstrap interval (`bootstrap_ci`'s construction) and
    `se` the standard deviation of the bootstrap replicates; `p_value` the exact two-sided sign-flip p-value
    over tasks (`longhaul.eval.stats.signflip`); `tasks` the common task count; `rate_a`, `rate_b` the two
    rates on those tasks.
    """

    diff: float
    ci: tuple[float, float]
    p_value: float
    tasks: int
    se: float
    rate_a: float
    rate_b: float
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["ci"] = list(self.ci)
        return d


def paired_difference(
    a: Outcomes,
    b: Outcomes,
    k: int,
    kind: str,
    rng: np.random.Generator,
    samples: int = BOOTSTRAP_SAMPLES,
    confidence: float = 1 - ALPHA,
) -> PairedResult:
    """rate(B) − rate(A) on the common tasks, with a hierarchical-bootstrap CI (one task resample shared by
    both arms — the pairing — and an independent seed resample per arm), its bootstrap SE, and the exact paired
    sign-flip p-value (`longhaul.eval.stats.signflip`). For two checkpoints, or two runs taken as they are; the
    verdict between configurations with seed noise is `longhaul.eval.stats.arms.compare_arms`."""
    _check_reps("samples", samples)
    a, b = common_tasks(a, b)
    ma, mb = TwoWay.of(cell_values(a, k, kind)), TwoWay.of(cell_values(b, k, kind))
    d_beta = mb.beta - ma.beta  # the per-task differences d_t minus their mean
    stats = (mb.g - ma.g) + _resampled_means(d_beta, rng, samples)
    stats = stats + _seed_term(mb, rng, samples) - _seed_term(ma, rng, samples)
    lo, hi = _widened(
        stats, mb.g - ma.g, confidence, [_task_component(d_beta), _seed_component(ma), _seed_component(mb)]
    )
    ci = (max(lo, -1.0), min(hi, 1.0))  # a difference of two rates lies in [−1, 1]
    ra, rb = rate(a, k, kind), rate(b, k, kind)
    return PairedResult(
        diff=rb - ra,
        ci=ci,
        p_value=permutation_p_value(a, b, k, kind),
        tasks=len(a.tasks),
        se=float(stats.std(ddof=1)) if samples > 1 else 0.0,
        rate_a=ra,
        rate_b=rb,
        confidence=confidence,
    )
