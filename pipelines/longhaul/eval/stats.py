"""Statistics for numbers you can trust: rates over seeds × tasks × samples, hierarchical bootstrap CIs,
paired differences with a permutation test, flip rates, and the power of a planned two-arm study.

Pure: no I/O, no clock; randomness only through an explicit `numpy.random.Generator` argument, so a result
is a function of its inputs and the generator's state.

Layout. One arm's outcomes are an `Outcomes`: a boolean array of shape (seeds, tasks, samples) — seeds are
training (or evaluation) runs of one configuration, samples are the n trials of each task within a run.
Every statistic starts from the cell value v[s, t] = pass^k (or pass@k) of the n samples of task t under
seed s, the unbiased estimator of `longhaul.eval.metrics` (C(c,k)/C(n,k), 1 − C(n−c,k)/C(n,k)).

    rate          mean over seeds of (macro mean over tasks of v[s, t])
    bootstrap CI  tasks resampled with replacement, then seeds with replacement (independently: seeds and
                  tasks are crossed, each seed runs every task); the samples of a cell are kept as they are
                  because v[s, t] is computed from them. Percentile interval of the seed and task margins,
                  widened by t_ν/z for few seeds (`bootstrap_ci` says exactly how and why).
    paired diff   rate(B) − rate(A) on the tasks both arms ran; the bootstrap draws one task resample for
                  both arms and a seed resample per arm; the p-value is a two-sided paired permutation
                  (sign-flip) test on the per-task differences d_t = mean_s vB[s, t] − mean_s vA[s, t].

What the permutation test can and cannot see. Swapping the arms' labels of one task is exchangeable under
H0 when whatever differs between runs differs task by task (sampling noise, a seed's luck on a task). A shift
of a whole run — a training seed that is better on every task — is shared by all tasks of one arm, so a
per-task swap does not reproduce it: with one training seed per arm such a shift is indistinguishable from a
treatment effect by any test. The hierarchical bootstrap resamples seeds and so widens the CI for it when an
arm has ≥ 2 seeds; `verdict` therefore asks for both p < α and a CI that excludes 0.

Power (`power`, `mde`, `required_design`): the paired two-arm design of pass^1 on the same T tasks, each arm
S seeds × N samples per task. The model, its parameters and where the defaults come from are documented at
`difference_variance`; the numbers below are the only defaults in this module.

Size: over 400 lines because the estimators, tests and power analysis share the bootstrap and carry their
calibration notes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from longhaul.eval.metrics import pass_at_k, pass_hat_k

# ---------------------------------------------------------------------------------------------------------
# Defaults — the one place they live.

#: Significance level of every test and the two-sided CI that goes with it (the conventional 5%).
ALPHA = 0.05

#: Target power of a planned study (the conventional 80%; issue 14 asks for the MDE at 80% power).
POWER = 0.80

#: Bootstrap replicates and permutations per estimate: the Monte Carlo error of a 95% percentile bound is
#: ≈ 0.06 standard errors (≈ 0.2 points at 50 tasks × 4 samples), that of a p-value near 0.05 ≈ ±0.005.
BOOTSTRAP_SAMPLES = 2000
PERMUTATIONS = 2000

#: The original ablation's baseline: vanilla GRPO step 200, pass^1 = 0.175 on 50 tasks × 4 samples
#: (notes/method.md g.1, g.2; the headline compares it with PRM-Lite+LATA step 250, 0.240).
DEFAULT_BASELINE = 0.175

#: Flip rate f between two runs of one configuration: the fraction of outcomes (same task, one sample each)
#: that differ. τ²-bench issue #540 (released trajectories, airline, 50 tasks) finds that two single runs
#: must differ by 5.5–11 points to be told apart; with one sample per task a run's score has variance
#: (f/2)/T, so d = 1.96·√(f/T) gives f = T·(d/1.96)² = 0.04–0.16. We take the upper end: the original's own
#: base model (pass^1 0.160, pass@4 0.340; method.md g.1) fits f ≈ 0.19 under a two-point task model, so 0.16
#: is not pessimistic for it. (The issue's "10–42% of tasks flip" counts tasks whose verdict changes at least
#: once over four runs — a different, larger number than this per-outcome pairwise rate.)
DEFAULT_FLIP_RATE = 0.16

#: Bounds of the search in `required_design`.
MAX_SEEDS = 1000
MAX_SAMPLES = 1000

#: Two statistics closer than this are a tie in the permutation test (the values are short sums of
#: rationals; float error is ~1e-15).
_TIE = 1e-10

KINDS = ("pass_hat", "pass_at")


# ---------------------------------------------------------------------------------------------------------
# Outcomes


def _task_sort_key(tid: str) -> tuple[int, str]:
    # The order of `metrics.build_task_counts`, so sums run in the same order and rates agree to the bit.
    return (int(tid), tid) if tid.isdigit() else (1 << 30, tid)


@dataclass(frozen=True, eq=False)
class Outcomes:
    """One arm's binary outcomes: `data[s, t, j]` is sample j of task `tasks[t]` under seed `seeds[s]`.

    A rectangular design — every seed ran every task with the same number of samples — is required: the
    macro mean over tasks and the seed resampling assume it. Build from records with `from_records`.
    """

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        data = np.asarray(self.data)
        if data.dtype != np.bool_:
            raise ValueError(f"Outcomes.data must be a bool array (got dtype {data.dtype})")
        if data.ndim != 3:
            raise ValueError(f"Outcomes.data must have shape (seeds, tasks, samples) (got shape {data.shape})")
        if data.shape[:2] != (len(self.seeds), len(self.tasks)):
            raise ValueError(
                f"Outcomes.data has shape {data.shape} but there are {len(self.seeds)} seeds and "
                f"{len(self.tasks)} tasks"
            )
        if 0 in data.shape:
            raise ValueError(f"Outcomes need at least one seed, task and sample (got shape {data.shape})")
        if len(set(self.tasks)) != len(self.tasks) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("Outcomes.tasks and Outcomes.seeds must not repeat")
        data = data.copy()
        data.setflags(write=False)
        object.__setattr__(self, "data", data)

    @property
    def samples(self) -> int:
        """Samples (trials) per task and seed."""
        return int(self.data.shape[2])

    @classmethod
    def from_array(cls, data: Any) -> Outcomes:
        """From a (seeds, tasks, samples) array; tasks are named "0", "1", …, seeds 0, 1, …"""
        arr = np.asarray(data, dtype=bool)
        if arr.ndim != 3:
            raise ValueError(f"expected a (seeds, tasks, samples) array (got shape {arr.shape})")
        return cls(tuple(str(t) for t in range(arr.shape[1])), tuple(range(arr.shape[0])), arr)

    @classmethod
    def from_records(cls, records: Iterable[tuple[int, str, int, bool]]) -> Outcomes:
        """From `(seed, task_id, trial, success)` tuples, in any order.

        Within a (seed, task) cell the samples are ordered by trial number. Raises ValueError for a repeated
        (seed, task, trial), for a task that some seed lacks, and for cells with different sample counts.
        """
        cells: dict[tuple[int, str], dict[int, bool]] = {}
        for seed, task, trial, success in records:
            cell = cells.setdefault((int(seed), str(task)), {})
            if int(trial) in cell:
                raise ValueError(
                    f"duplicate record: seed {seed} task {str(task)!r} trial {trial} appears twice "
                    "(a result was written twice; keep one)"
                )
            cell[int(trial)] = bool(success)
        if not cells:
            raise ValueError("no records")
        seeds = sorted({s for s, _ in cells})
        tasks = sorted({t for _, t in cells}, key=_task_sort_key)
        for s in seeds:
            missing = [t for t in tasks if (s, t) not in cells]
            if missing:
                shown = ", ".join(repr(t) for t in missing[:10]) + (" …" if len(missing) > 10 else "")
                raise ValueError(
                    f"ragged design: seed {s} has no records for {len(missing)} task(s) that other "
                    f"seeds ran: {shown}; evaluate every seed on the same tasks or drop those tasks"
                )
        sizes: dict[int, int] = {}
        for cell in cells.values():
            sizes[len(cell)] = sizes.get(len(cell), 0) + 1
        n = max(sizes, key=lambda m: (sizes[m], m))
        for (s, t), cell in sorted(cells.items(), key=lambda kv: (kv[0][0], _task_sort_key(kv[0][1]))):
            if len(cell) != n:
                raise ValueError(
                    f"ragged design: seed {s} task {t!r} has {len(cell)} samples (trials "
                    f"{sorted(cell)[:20]}), the other cells have {n}; every (seed, task) needs the "
                    "same number of samples"
                )
        data = np.array([[[cells[(s, t)][j] for j in sorted(cells[(s, t)])] for t in tasks] for s in seeds], dtype=bool)
        return cls(tuple(tasks), tuple(seeds), data)

    def restrict(self, tasks: Iterable[str]) -> Outcomes:
        """The same arm on a subset of its tasks (in the order given)."""
        index = {t: i for i, t in enumerate(self.tasks)}
        keep = list(tasks)
        unknown = [t for t in keep if t not in index]
        if unknown:
            raise ValueError(f"tasks not in this arm: {unknown[:10]}")
        return Outcomes(tuple(keep), self.seeds, self.data[:, [index[t] for t in keep], :])


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is unknown; valid: {', '.join(KINDS)}")


def cell_values(o: Outcomes, k: int = 1, kind: str = "pass_hat") -> np.ndarray:
    """(seeds, tasks) array of per-cell pass^k / pass@k, computed with `metrics.pass_hat_k` / `pass_at_k`."""
    _check_kind(kind)
    n = o.samples
    fn = pass_hat_k if kind == "pass_hat" else pass_at_k
    if not 1 <= k <= n:
        raise ValueError(f"k={k} needs 1 ≤ k ≤ n samples per task (n={n}); run more samples or drop k")
    table = np.array([fn(c, n, k) for c in range(n + 1)], dtype=np.float64)
    return table[o.data.sum(axis=2)]


def rate(o: Outcomes, k: int = 1, kind: str = "pass_hat") -> float:
    """Mean over seeds of the macro mean over tasks of the cell's unbiased pass^k (C(c,k)/C(n,k)) or pass@k
    (1 − C(n−c,k)/C(n,k)). With one seed it equals `metrics.compute_rate` on the same records, to the bit."""
    v = cell_values(o, k, kind)
    per_seed = [sum(float(x) for x in row) / len(row) for row in v]
    return sum(per_seed) / len(per_seed)


# ---------------------------------------------------------------------------------------------------------
# Bootstrap


def _resampled_means(x: np.ndarray, rng: np.random.Generator, reps: int) -> np.ndarray:
    """Means of `reps` resamples of x (with replacement, each of size x.size); vectorised, O(reps · x.size)."""
    if x.size == 1:
        return np.full(reps, float(x[0]))
    return x[rng.integers(0, x.size, size=(reps, x.size), dtype=np.int32)].mean(axis=1)


@dataclass(frozen=True)
class _Margins:
    """A (seeds, tasks) table of cell values split as v[s, t] = g + α_s + β_t + γ_st (grand mean, seed and task
    margins, residual), with the method-of-moments seed-wide variance σ̂_a² = max(0, s²_α − MS_γ / T): a
    seed margin α_s also carries the average of T residuals, whose variance MS_γ / T is taken out."""

    g: float
    alpha: np.ndarray
    beta: np.ndarray
    seed_var: float

    @classmethod
    def of(cls, v: np.ndarray) -> _Margins:
        s, t = v.shape
        g = float(v.mean())
        alpha, beta = v.mean(axis=1) - g, v.mean(axis=0) - g
        seed_var = 0.0
        if s > 1:
            resid = v - g - alpha[:, None] - beta[None, :]
            ms_resid = float((resid**2).sum()) / ((s - 1) * (t - 1)) if t > 1 else 0.0
            seed_var = max(0.0, float((alpha**2).sum()) / (s - 1) - ms_resid / t)
        return cls(g, alpha, beta, seed_var)

    def seed_term(self, rng: np.random.Generator, reps: int) -> np.ndarray:
        """Means of resampled seed margins, scaled so that their bootstrap variance is σ̂_a² / S."""
        s = self.alpha.size
        if s == 1 or self.seed_var == 0:
            return np.zeros(reps)
        s2_alpha = float((self.alpha**2).sum()) / (s - 1)
        return math.sqrt(self.seed_var / s2_alpha * s / (s - 1)) * _resampled_means(self.alpha, rng, reps)

    def seed_component(self) -> tuple[float, int]:
        """(variance of the seed-wide part of the rate, its degrees of freedom)."""
        return self.seed_var / self.alpha.size, max(1, self.alpha.size - 1)


def _task_component(beta: np.ndarray) -> tuple[float, int]:
    """(variance of the task part of the rate, s²_β / T, and its degrees of freedom T − 1)."""
    t = beta.size
    return (float((beta**2).sum()) / (t - 1) / t, t - 1) if t > 1 else (0.0, 1)


def _widened(stats: np.ndarray, est: float, confidence: float, parts: list[tuple[float, int]]) -> tuple[float, float]:
    """Percentile interval of `stats`, widened about `est` by t_ν/z, ν the Welch–Satterthwaite degrees of freedom
    of the variance components `parts` ((variance, df) pairs)."""
    lo, hi = _interval(stats, confidence)
    total = sum(v for v, _ in parts)
    denom = sum(v * v / df for v, df in parts)
    if total <= 0 or denom <= 0:
        return lo, hi
    q = (1 + confidence) / 2
    f = t_quantile(q, total * total / denom) / NormalDist().inv_cdf(q)
    return est - f * (est - lo), est + f * (hi - est)


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by its continued fraction (modified Lentz), accurate to ~1e-14."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _regularized_beta(1 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_quantile(q: float, df: float) -> float:
    """Quantile of Student's t with `df` (real, > 0) degrees of freedom: safeguarded Newton on its CDF."""
    if not 0 < q < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < q < 1 and df > 0 (got q={q}, df={df})")
    if df > 1e7:
        return NormalDist().inv_cdf(q)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        tail = 0.5 * _regularized_beta(df / (df + x * x), df / 2, 0.5)
        return 1 - tail if x > 0 else tail

    lo, hi = -1.0, 1.0
    while cdf(lo) > q:
        lo *= 2
    while cdf(hi) < q:
        hi *= 2
    x = NormalDist().inv_cdf(q)
    x = x if lo < x < hi else (lo + hi) / 2
    for _ in range(200):
        err = cdf(x) - q
        if err == 0:
            return x
        lo, hi = (x, hi) if err < 0 else (lo, x)
        pdf = math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))
        step = x - err / pdf if pdf > 0 else (lo + hi) / 2
        nxt = step if lo < step < hi else (lo + hi) / 2
        if abs(nxt - x) <= 1e-13 * max(1.0, abs(x)):
            return nxt
        x = nxt
    return x


def _interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    lo, hi = np.quantile(stats, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


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
    (`_Margins`: the seed term gets the seed-wide variance with the cell noise taken out, and the S/(S−1)
    the plain bootstrap loses). The interval is the percentile interval of the replicates, widened about the
    estimate by t_ν / z, ν the Welch–Satterthwaite degrees of freedom of the two variance parts (T − 1 for
    the tasks, S − 1 for the seeds): with 2–3 seeds and a visible seed-wide shift the interval widens as a t
    interval does; without one ν ≈ T − 1 (a factor 1.02 at 50 tasks). Clipped to [0, 1].

    With one seed the replicates are exactly the task bootstrap's. Why margins rather than redrawn cells
    (the "pigeonhole" bootstrap): redrawing cells counts the cell noise γ about three times — it is already
    in the task and the seed margins — which makes a paired difference's CI far too wide; tasks alone (the
    seed-averaged per-task values) miss seed-wide shifts. tests/unit/eval/test_stats_calibration.py measures
    the coverage of all three against a known truth. Vectorised: O(samples · (S + T))."""
    _check_reps("samples", samples)
    m = _Margins.of(cell_values(o, k, kind))
    stats = m.g + _resampled_means(m.beta, rng, samples) + m.seed_term(rng, samples)
    lo, hi = _widened(stats, m.g, confidence, [_task_component(m.beta), m.seed_component()])
    # The widening can step past the range a rate can take; the truth never lies there.
    return max(lo, 0.0), min(hi, 1.0)


# ---------------------------------------------------------------------------------------------------------
# Paired difference


@dataclass(frozen=True)
class PairedResult:
    """Arm B minus arm A on the tasks both ran.

    `diff` = rate(B) − rate(A); `ci` its hierarchical-bootstrap interval (`bootstrap_ci`'s construction) and
    `se` the standard deviation of the bootstrap replicates; `p_value` the two-sided paired permutation
    p-value; `tasks` the common task count; `rate_a`, `rate_b` the two rates on those tasks.
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
        d = asdict(self)
        d["ci"] = list(self.ci)
        return d


def _common(a: Outcomes, b: Outcomes) -> tuple[Outcomes, Outcomes]:
    in_b = set(b.tasks)
    common = [t for t in a.tasks if t in in_b]
    if not common:
        raise ValueError(
            f"the two arms have no task in common (A: {len(a.tasks)} tasks, e.g. {list(a.tasks[:5])}; "
            f"B: {len(b.tasks)} tasks, e.g. {list(b.tasks[:5])}); compare arms evaluated on the same "
            "tasks"
        )
    return a.restrict(common), b.restrict(common)


def task_differences(a: Outcomes, b: Outcomes, k: int = 1, kind: str = "pass_hat") -> np.ndarray:
    """d_t = mean over B's seeds of vB[s, t] − mean over A's seeds of vA[s, t], on the common tasks."""
    a, b = _common(a, b)
    return cell_values(b, k, kind).mean(axis=0) - cell_values(a, k, kind).mean(axis=0)


def permutation_p_value(
    a: Outcomes, b: Outcomes, k: int, kind: str, rng: np.random.Generator, permutations: int = PERMUTATIONS
) -> float:
    """Two-sided paired permutation test of rate(B) = rate(A): each permutation swaps the arms' labels of
    every task independently with probability 1/2, which turns d_t into −d_t. With the observed statistic
    D = mean_t d_t and `permutations` permuted ones D*,

        p = (#{|D*| > |D|} + U · (1 + #{|D*| = |D|})) / (1 + permutations),   U ~ Uniform(0, 1) from `rng`

    i.e. (1 + #{|D*| ≥ |D|}) / (1 + permutations) with the ties broken at random. pass^k values sit on a
    coarse lattice (multiples of 1/(n·T) for pass^1), so |D*| = |D| has probability ~1–2%; counting every
    tie as "as extreme" gives a valid but conservative test (3.5% false positives at α = 5% for 50 tasks ×
    4 samples), random tie-breaking makes p uniform under H0 and the test's size exactly α. D = 0 gives
    p = 1. Valid when the arms are exchangeable task by task (see the module docstring on whole-seed
    shifts)."""
    _check_reps("permutations", permutations)
    d = task_differences(a, b, k, kind)
    obs = abs(float(d.mean()))
    if obs <= _TIE:
        return 1.0  # D = 0: nothing to explain (and no random p for identical arms)
    flips = rng.integers(0, 2, size=(permutations, d.size)).astype(np.float64)
    perm = np.abs(d.sum() - 2.0 * (flips @ d)) / d.size
    above = np.count_nonzero(perm > obs + _TIE)
    ties = np.count_nonzero(np.abs(perm - obs) <= _TIE)
    return float((above + rng.random() * (1 + ties)) / (1 + permutations))


def paired_difference(
    a: Outcomes,
    b: Outcomes,
    k: int,
    kind: str,
    rng: np.random.Generator,
    samples: int = BOOTSTRAP_SAMPLES,
    permutations: int = PERMUTATIONS,
    confidence: float = 1 - ALPHA,
) -> PairedResult:
    """rate(B) − rate(A) on the common tasks, with a hierarchical-bootstrap CI (one task resample shared by
    both arms — the pairing — and an independent seed resample per arm), its bootstrap SE, and the paired
    permutation p-value (`permutation_p_value`)."""
    _check_reps("samples", samples)
    a, b = _common(a, b)
    ma, mb = _Margins.of(cell_values(a, k, kind)), _Margins.of(cell_values(b, k, kind))
    d_beta = mb.beta - ma.beta  # the per-task differences d_t minus their mean
    stats = (mb.g - ma.g) + _resampled_means(d_beta, rng, samples)
    stats = stats + mb.seed_term(rng, samples) - ma.seed_term(rng, samples)
    lo, hi = _widened(
        stats, mb.g - ma.g, confidence, [_task_component(d_beta), ma.seed_component(), mb.seed_component()]
    )
    ci = (max(lo, -1.0), min(hi, 1.0))  # a difference of two rates lies in [−1, 1]
    ra, rb = rate(a, k, kind), rate(b, k, kind)
    return PairedResult(
        diff=rb - ra,
        ci=ci,
        p_value=permutation_p_value(a, b, k, kind, rng, permutations),
        tasks=len(a.tasks),
        se=float(stats.std(ddof=1)) if samples > 1 else 0.0,
        rate_a=ra,
        rate_b=rb,
        confidence=confidence,
    )


# ---------------------------------------------------------------------------------------------------------
# Flip rates


def flip_rate(o: Outcomes) -> float | None:
    """Between-seed flip rate: the probability that one sample of a task under one seed and one sample of the
    same task under another seed disagree, averaged over tasks and seed pairs (all n × n sample pairings of
    the two seeds are used: the same expectation as pairing sample j with sample j, with less noise; for
    n = 1 they coincide). None with one seed. Under independent outcomes with per-cell success probability
    p it estimates E[p_s(1 − p_s') + p_s'(1 − p_s)]."""
    if len(o.seeds) < 2:
        return None
    n = o.samples
    c = o.data.sum(axis=2).astype(np.float64)  # (S, T)
    dis = c[:, None, :] * (n - c[None, :, :]) + c[None, :, :] * (n - c[:, None, :])  # (S, S, T), symmetric
    iu = np.triu_indices(len(o.seeds), k=1)
    return float(dis[iu].mean() / (n * n))


def within_seed_flip_rate(o: Outcomes) -> float | None:
    """Within-seed flip rate: the probability that two different samples of one task under one seed
    disagree, 2c(n − c)/(n(n − 1)) per cell (unbiased for 2p(1 − p)), averaged over cells. None when n = 1."""
    n = o.samples
    if n < 2:
        return None
    c = o.data.sum(axis=2).astype(np.float64)
    return float((2 * c * (n - c) / (n * (n - 1))).mean())


# ---------------------------------------------------------------------------------------------------------
# Power of a planned paired study


def _check_design(
    tasks: int,
    samples: int,
    seeds: int,
    baseline: float,
    flip_rate: float,
    within_flip_rate: float | None,
    effect_sd: float,
) -> float:
    for name, value in (("tasks", tasks), ("samples", samples), ("seeds", seeds)):
        if isinstance(value, bool) or not (value == math.inf or (int(value) == value and value >= 1)):
            raise ValueError(f"{name} must be a whole number ≥ 1 (got {value!r})")
    if not 0 < baseline < 1:
        raise ValueError(f"baseline must be a pass^1 rate strictly between 0 and 1 (got {baseline!r})")
    most = 2 * baseline * (1 - baseline)
    if not 0 <= flip_rate <= most + 1e-12:
        raise ValueError(
            f"flip_rate must be in [0, 2·b·(1−b)] = [0, {most:.3f}] at baseline b = {baseline:g} "
            f"(got {flip_rate!r}): two runs cannot disagree more often than independent coin flips "
            "at the baseline rate; measure it on arms near this baseline"
        )
    fw = flip_rate if within_flip_rate is None else within_flip_rate
    if not 0 <= fw <= flip_rate + 1e-12:
        raise ValueError(
            f"within_flip_rate must be in [0, flip_rate] = [0, {flip_rate:g}] (got {fw!r}): samples "
            "of one seed cannot disagree more often than samples of different seeds"
        )
    if effect_sd < 0:
        raise ValueError(f"effect_sd must be ≥ 0 (got {effect_sd!r})")
    return fw


def difference_variance(
    effect: float,
    tasks: int,
    samples: int,
    seeds: int,
    baseline: float,
    flip_rate: float,
    *,
    within_flip_rate: float | None = None,
    effect_sd: float = 0.0,
) -> float:
    """Per-task variance V of d_t (the paired difference of one task) under the planning model; the
    difference of the arm means then has variance V / T.

    Model. Arm A's task t has success probability p_t (mean over tasks = `baseline`); seed s moves it to
    p_st = p_t + u_st with Var(u) = σ_u²; samples are Bernoulli(p_st). Arm B is the same with every p moved
    by the effect δ (plus a task-specific part of SD `effect_sd`, independent of p). Task difficulty p_t is
    shared by both arms and cancels in d_t. The flip rates fix the two variance components:
        f  (between runs/seeds) = 2·E[p_t(1 − p_t)]          ⇒ per-outcome run-to-run variance f/2
        f_w (within a seed)     = 2·E[p_st(1 − p_st)]        ⇒ σ_e² = f_w/2,  σ_u² = (f − f_w)/2
    so for arm A Var(cell mean) = σ_u² + σ_e²/N and for arm B σ_e² becomes f_w/2 + δ(1 − 2b) − δ² − σ_δ²
    (E[(p+δ)(1−p−δ)] with E p = b). Averaging S seeds per arm:
        V = [ (f − f_w) + (f_w + δ(1 − 2b) − δ² − σ_δ²) / N ] / S + σ_δ²
    `within_flip_rate` None means f_w = f (all run-to-run variance is sampling noise; seeds and samples are
    then interchangeable). Not modelled: a shift of a whole seed shared by all its tasks (see the module
    docstring) — with few seeds the real variance is larger.
    """
    fw = _check_design(tasks, samples, seeds, baseline, flip_rate, within_flip_rate, effect_sd)
    within_b = max(0.0, fw + effect * (1 - 2 * baseline) - effect * effect - effect_sd**2)
    return ((flip_rate - fw) + within_b / samples) / seeds + effect_sd**2


def _power(
    effect: float,
    tasks: int,
    samples: int | float,
    seeds: int | float,
    baseline: float,
    flip_rate: float,
    alpha: float,
    within_flip_rate: float | None,
    effect_sd: float,
) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (got {alpha!r})")
    if not -baseline <= effect <= 1 - baseline:
        raise ValueError(f"effect {effect:+g} would move the baseline {baseline:g} outside [0, 1]")
    if 2.0 ** (1 - tasks) > alpha:  # the exact sign-flip test's smallest two-sided p-value is 2/2^T
        return 0.0
    v = difference_variance(
        effect,
        tasks,
        samples,
        seeds,
        baseline,
        flip_rate,  # type: ignore[arg-type]
        within_flip_rate=within_flip_rate,
        effect_sd=effect_sd,
    )
    z = NormalDist().inv_cdf(1 - alpha / 2)
    # The sign-flip test compares D with its permutation spread √(Σ d_t²)/T, and Σ d_t²/T ≈ V + δ².
    c = z * math.sqrt((v + effect * effect) / tasks)
    sd = math.sqrt(v / tasks)
    if sd == 0:
        return 1.0 if abs(effect) > c else 0.0
    phi = NormalDist().cdf
    return phi((effect - c) / sd) + phi((-effect - c) / sd)


def power(
    effect: float,
    tasks: int,
    samples: int,
    seeds: int,
    baseline: float = DEFAULT_BASELINE,
    flip_rate: float = DEFAULT_FLIP_RATE,
    alpha: float = ALPHA,
    *,
    within_flip_rate: float | None = None,
    effect_sd: float = 0.0,
) -> float:
    """Probability that the paired permutation test (`permutation_p_value`, two-sided, level `alpha`) finds
    an effect of `effect` (a fraction: 0.065 = 6.5 points of pass^1) with T tasks, N samples and S seeds per
    arm. Normal approximation: D = mean_t d_t ~ N(δ, V/T) with V from `difference_variance`, rejected when
    |D| > z_{1−α/2}·√((V + δ²)/T) (the test's permutation spread is √(Σ d_t²)/T and Σ d_t²/T ≈ V + δ²).
    0 when T is so small that the exact test cannot reach `alpha` (2/2^T ≥ α).

    Accuracy, against the simulated test (tests/unit/eval/test_stats_calibration.py): within 2.5 points at 50
    tasks. With few tasks the per-task differences are far from normal and the approximation understates
    power (two-point task model, 4 samples: 0.80 predicted vs 0.94 simulated at 10 tasks, 0.59 vs 0.67 at 30)
    — read small-T results as a lower bound."""
    return _power(effect, tasks, samples, seeds, baseline, flip_rate, alpha, within_flip_rate, effect_sd)


def mde(
    tasks: int,
    samples: int,
    seeds: int,
    baseline: float = DEFAULT_BASELINE,
    flip_rate: float = DEFAULT_FLIP_RATE,
    alpha: float = ALPHA,
    power: float = POWER,
    *,
    within_flip_rate: float | None = None,
    effect_sd: float = 0.0,
) -> float:
    """Minimum detectable effect: the smallest improvement δ > 0 (a fraction) over `baseline` that the
    design detects with probability `power` (see `power`); math.inf when no δ ≤ 1 − baseline reaches it."""
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1) (got {power!r})")

    def pw(d: float) -> float:
        return _power(d, tasks, samples, seeds, baseline, flip_rate, alpha, within_flip_rate, effect_sd)

    top = 1 - baseline
    grid = [top * i / 200 for i in range(1, 201)]
    hit = next((i for i, d in enumerate(grid) if pw(d) >= power), None)
    if hit is None:
        return math.inf
    lo, hi = (grid[hit - 1] if hit else 0.0), grid[hit]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if pw(mid) >= power else (mid, hi)
    return hi


@dataclass(frozen=True)
class DesignNeed:
    """What a target effect needs (see `required_design`).

    `seeds`: seeds per arm at the given samples per task (None: more than MAX_SEEDS). `samples`: samples per
    task at the given seeds (None: more than MAX_SAMPLES, or unreachable because the seed × task component
    does not shrink with samples). `power_limit`: power with unlimited seeds and samples at this task count;
    `bounded_by_tasks`: True when even that is below the target — only more tasks help.
    """

    effect: float
    target_power: float
    tasks: int
    at_samples: int
    at_seeds: int
    seeds: int | None
    samples: int | None
    power_limit: float
    bounded_by_tasks: bool

    def describe(self) -> str:
        pts = f"{self.effect * 100:+.1f} points at {self.target_power:.0%} power"
        if self.bounded_by_tasks:
            return (
                f"{pts}: not reachable with {self.tasks} tasks — at most {self.power_limit:.0%} power however "
                "many seeds and samples; add tasks"
            )
        parts = []
        if self.seeds is not None:
            parts.append(
                f"{self.seeds} seed{'s' if self.seeds != 1 else ''} per arm at {self.at_samples} "
                f"sample{'s' if self.at_samples != 1 else ''} per task"
            )
        if self.samples is not None:
            parts.append(
                f"{self.samples} sample{'s' if self.samples != 1 else ''} per task at {self.at_seeds} "
                f"seed{'s' if self.at_seeds != 1 else ''} per arm"
            )
        if not parts:
            return f"{pts}: needs more than {MAX_SEEDS} seeds per arm at {self.at_samples} samples per task"
        return f"{pts} needs " + ", or ".join(parts)


def _smallest(check: Any, limit: int) -> int | None:
    """Smallest m in 1..limit with check(m) (check monotone in m), or None."""
    if not check(limit):
        return None
    lo, hi = 0, limit  # check(lo) False (or lo = 0), check(hi) True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if check(mid) else (mid, hi)
    return hi


def required_design(
    effect: float,
    tasks: int,
    samples: int,
    seeds: int,
    baseline: float = DEFAULT_BASELINE,
    flip_rate: float = DEFAULT_FLIP_RATE,
    alpha: float = ALPHA,
    power: float = POWER,
    *,
    within_flip_rate: float | None = None,
    effect_sd: float = 0.0,
) -> DesignNeed:
    """Seeds per arm (at `samples` per task) and samples per task (at `seeds` per arm) that give `effect` the
    target power, or the statement that the task count bounds it (the limit of `power` as seeds and samples
    grow: V → σ_δ²)."""
    if effect == 0:
        raise ValueError("effect must be non-zero: no design has power against an effect of 0")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1) (got {power!r})")

    def pw(n: float, s: float) -> float:
        return _power(effect, tasks, n, s, baseline, flip_rate, alpha, within_flip_rate, effect_sd)

    limit = pw(math.inf, math.inf)
    if limit < power:
        return DesignNeed(effect, power, tasks, samples, seeds, None, None, limit, True)
    need_seeds = _smallest(lambda s: pw(samples, s) >= power, MAX_SEEDS)
    need_samples = _smallest(lambda n: pw(n, seeds) >= power, MAX_SAMPLES)
    return DesignNeed(effect, power, tasks, samples, seeds, need_seeds, need_samples, limit, False)


# ---------------------------------------------------------------------------------------------------------
# A study's design as a file (`longhaul power --from-comparison`)


@dataclass(frozen=True)
class StudyDesign:
    """The numbers `longhaul power` plans from: the design of an existing comparison (tasks, samples per
    task, seeds per arm) and what it measured (baseline pass^1, between-run flip rate, optionally the
    within-seed flip rate). JSON: `{"tasks": 50, "samples": 4, "seeds": 1, "baseline": 0.175,
    "flip_rate": 0.16, "within_flip_rate": null}`."""

    tasks: int
    samples: int
    seeds: int
    baseline: float
    flip_rate: float
    within_flip_rate: float | None = None

    FIELDS = ("tasks", "samples", "seeds", "baseline", "flip_rate", "within_flip_rate")

    def to_json(self) -> str:
        return json.dumps({f: getattr(self, f) for f in self.FIELDS}, indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StudyDesign:
        """Validated: raises ValueError naming the field, the value received and what is expected."""
        if not isinstance(d, Mapping):
            raise ValueError(f"expected a JSON object with keys {', '.join(cls.FIELDS)} (got {type(d).__name__})")
        unknown = sorted(set(d) - set(cls.FIELDS))
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}; valid: {', '.join(cls.FIELDS)}")
        missing = [f for f in cls.FIELDS[:5] if f not in d]
        if missing:
            raise ValueError(f"field {missing[0]!r} is missing; required: {', '.join(cls.FIELDS[:5])}")
        vals: dict[str, Any] = {}
        for f in ("tasks", "samples", "seeds"):
            v = d[f]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"field {f!r}: expected a whole number ≥ 1 (got {v!r})")
            vals[f] = v
        for f in ("baseline", "flip_rate", "within_flip_rate"):
            v = d.get(f)
            if v is None and f == "within_flip_rate":
                vals[f] = None
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise ValueError(f"field {f!r}: expected a number in [0, 1] (got {v!r})")
            vals[f] = float(v)
        out = cls(**vals)
        try:
            _check_design(out.tasks, out.samples, out.seeds, out.baseline, out.flip_rate, out.within_flip_rate, 0.0)
        except ValueError as exc:
            raise ValueError(f"field {str(exc).split(' ', 1)[0]!r}: {exc}") from None
        return out

    @classmethod
    def from_outcomes(cls, o: Outcomes) -> StudyDesign:
        """The design and measured noise of one arm (use the baseline arm): pass^1, the between-seed flip rate
        (the within-seed one when there is one seed), and the within-seed flip rate. Kept inside what the
        planning model allows (`difference_variance`): the baseline within [0.01, 0.99], the flip rates at most
        2·b·(1−b) (seed-wide shifts or a small arm can measure more) and the within-seed one at most the
        between-seed one."""
        within = within_seed_flip_rate(o)
        between = flip_rate(o)
        f = between if between is not None else within
        if f is None:
            raise ValueError("one seed with one sample per task measures no flip rate; run ≥ 2 samples or seeds")
        b = min(max(rate(o, 1), 0.01), 0.99)
        f = min(f, 2 * b * (1 - b))
        return cls(len(o.tasks), o.samples, len(o.seeds), b, f, None if within is None else min(within, f))


# ---------------------------------------------------------------------------------------------------------
# Verdict


def _points(x: float) -> str:
    return f"{x * 100:+.1f}".replace("-", "−")


def _p(p: float) -> str:
    return f"{p:.2g}"


def verdict(result: PairedResult, mde: float, alpha: float = ALPHA, a: str = "A", b: str = "B") -> str:
    """One line: `+4.1 points [−2.0, 10.3], p = 0.21, MDE 8.7: not distinguishable from noise`.

    Rule: "B better than A" (or "A better than B") only when the permutation p < `alpha` AND the CI excludes
    0 — the test guards against per-task noise, the seed-resampling CI against whole-seed shifts (module
    docstring); otherwise "not distinguishable from noise". Points are percentage points (× 100); the MDE
    is the design's (see `mde`), shown so a reader can see how small an effect the study could have seen.
    """
    lo, hi = result.ci
    ci = f"[{_points(lo).lstrip('+')}, {_points(hi).lstrip('+')}]"
    m = "n/a" if not math.isfinite(mde) else f"{mde * 100:.1f}"
    head = f"{_points(result.diff)} points {ci}, p = {_p(result.p_value)}, MDE {m}"
    if result.p_value < alpha and (lo > 0 or hi < 0):
        better, worse = (b, a) if result.diff > 0 else (a, b)
        return f"{head}: {better} better than {worse}"
    return f"{head}: not distinguishable from noise"
