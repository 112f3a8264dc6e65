"""Power of the verdict's rule for a planned paired two-arm study of pass^1 (pure): `power`, `mde`,
`required_design`. The rule is `longhaul compare`'s (`longhaul.eval.stats.arms`): with ≥ 2 seeds per arm, B is
called better than A when the Welch–Satterthwaite t-test — the seed variance measured from the seeds — and the
exact sign-flip test over tasks both give p < α (α/M for a family of M verdicts under Holm: the level Holm is
guaranteed to test each at, so the power here is a lower bound for a family). With one seed per arm the verdict
never calls a difference: power 0, MDE none.

Design: T tasks, both arms on the same tasks, S seeds per arm, N samples per task and seed. The variance model
is `difference_variance` (tasks) plus the whole-seed shifts σ_seed (`DEFAULT_SEED_SD` unless given). Power is
computed, not simulated: D ~ N(δ, V/T + 2σ²_seed/S); the test's own variance estimate is random — its task part
a scaled χ²_{T−1}, its seed part from the seed margins' mean square, a scaled χ² with 2(S − 1) degrees of freedom
less the cell noise (method of moments, truncated at 0) — and so are its degrees of freedom and t quantile; the
power is averaged over both by quadrature (`_rule_power`). The sign-flip half of the rule enters only through its
floor: with 2/2^T > α no test over T tasks can reject.

Accuracy against the rule simulated through `longhaul.analysis.study.build_statistics` (benchmarks/
calibrate_compare.py, 1000 studies each): power at this MDE 77–81% for a target of 80% on six designs (10–50
tasks, 2–10 seeds, seed SD 0 and 2.4 points); the lowest, 77%, with 10 tasks of very unequal difficulty, where
the exact sign-flip half of the rule — not modelled beyond its floor — costs a little. A reduced run is in
tests/unit/tracking/test_compare_calibration.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import chdtr, chdtri, ndtr, ndtri, stdtrit

from longhaul.eval.stats.defaults import (
    ALPHA,
    DEFAULT_BASELINE,
    DEFAULT_FLIP_RATE,
    DEFAULT_SEED_SD,
    MAX_SAMPLES,
    MAX_SEEDS,
    POWER,
)

#: Quadrature nodes over the seed part's and the task part's χ² (`_rule_power`): the MDE within 0.5% of 256 × 128
#: nodes' on the designs tried (2–10 seeds, 10–200 tasks, 1–4 samples).
_QUAD_SEED = 16
_QUAD_TASK = 16


def check_design(
    tasks: float,
    samples: float,
    seeds: float,
    baseline: float,
    flip_rate: float,
    within_flip_rate: float | None = None,
    effect_sd: float = 0.0,
    seed_sd: float = DEFAULT_SEED_SD,
) -> float:
    """ValueError naming the first argument outside what the planning model allows; the within-seed flip rate
    to use (the between-run one when None)."""
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
    if not 0 <= seed_sd <= 0.5:
        raise ValueError(f"seed_sd must be in [0, 0.5] (got {seed_sd!r}): the SD of a whole seed's shift of pass^1")
    return fw


def difference_variance(
    effect: float,
    tasks: float,
    samples: float,
    seeds: float,
    baseline: float,
    flip_rate: float,
    *,
    within_flip_rate: float | None = None,
    effect_sd: float = 0.0,
) -> float:
    """Per-task variance V of d_t (the paired difference of one task) under the planning model, whole-seed shifts
    left out (they do not average over tasks; `power` adds them as 2σ²_seed/S); the task part of the difference of
    the arm means then has variance V / T.

    Model. Arm A's task t has success probability p_t (mean over tasks = `baseline`); seed s moves it to
    p_st = p_t + u_st with Var(u) = σ_u²; samples are Bernoulli(p_st). Arm B is the same with every p moved
    by the effect δ (plus a task-specific part of SD `effect_sd`, independent of p). Task difficulty p_t is
    shared by both arms and cancels in d_t. The flip rates fix the two variance components:
        f  (between runs/seeds) = 2·E[p_t(1 − p_t)]          ⇒ per-outcome run-to-run variance f/2
        f_w (within a seed)     = 2·E[p_st(1 − p_st)]        ⇒ σ_e² = f_w/2,  σ_u² = (f − f_w)/2
    so for arm A Var(cell mean) = σ_u² + σ_e²/N and for arm B σ_e² becomes f_w/2 + δ(1 − 2b) − δ² − σ_δ²
    (E[(p+δ)(1−p−δ)] with E p = b). Averaging S seeds per arm:
        V = [ (f − f_w) + (f_w + δ(1 − 2b) − δ² − σ_δ²) / N ] / S + σ_δ²
    `within_flip_rate` None means f_w = f (all run-to-run variance is sampling noise). A measured f − f_w also
    holds the whole-seed part, which `power` counts again in its seed term: O(1/T) of it, on the safe side.
    """
    fw = check_design(tasks, samples, seeds, baseline, flip_rate, within_flip_rate, effect_sd, 0.0)
    within_b = max(0.0, fw + effect * (1 - 2 * baseline) - effect * effect - effect_sd**2)
    return ((flip_rate - fw) + within_b / samples) / seeds + effect_sd**2


@lru_cache(maxsize=1024)
def _chi2_nodes(df: int, lo: float, nodes: int) -> np.ndarray:
    """χ²_df / df at the mid-quantiles of [lo, 1] (levels lo + (1 − lo)(i + ½)/nodes): equal-weight quadrature of
    a scaled χ² restricted to its upper 1 − lo."""
    levels = lo + (1 - lo) * (np.arange(nodes) + 0.5) / nodes
    out = chdtri(df, 1 - levels) / df
    out.setflags(write=False)  # shared by the cache
    return out


def _rule_power(effect: float, tasks: int, v: float, cell: float, seeds: float, seed_sd: float, alpha: float) -> float:
    """P(the t half of the rule rejects) for per-task variance v, cell variance `cell`, S seeds (module docstring).

    The seed margins' mean square MS_α is (σ²_seed + cell/T)·χ²_df/df, df = 2(S − 1); below cell/T the estimate σ̂²
    is truncated to 0 and the test is the task part's t with T − 1 df — that share of the χ² (its CDF at the kink)
    is one node, exactly; the rest gets `_QUAD_SEED` nodes."""
    v_task = v / tasks
    c = 0.0 if seeds == math.inf else 2 / seeds
    sd = math.sqrt(v_task + c * seed_sd**2)
    if sd == 0:
        return 1.0 if effect != 0 else 0.0
    vt = v_task * _chi2_nodes(tasks - 1, 0.0, _QUAD_TASK)
    q = 1 - alpha / 2

    def rejected(cut: np.ndarray) -> np.ndarray:
        return ndtr((effect - cut) / sd) + ndtr((-effect - cut) / sd)

    unmeasured = float(rejected(stdtrit(tasks - 1, q) * np.sqrt(vt)).mean())
    if c == 0:
        return unmeasured
    df_seed, df_resid = int(2 * (seeds - 1)), int(2 * (seeds - 1) * (tasks - 1))
    scale, kink = seed_sd**2 + cell / tasks, cell / tasks
    truncated = float(chdtr(df_seed, df_seed * kink / scale)) if scale > 0 else 1.0
    if truncated >= 1:
        return unmeasured
    ms = scale * _chi2_nodes(df_seed, truncated, _QUAD_SEED)[:, None]
    se2 = vt[None, :] + c * np.maximum(0.0, ms - kink)
    seed_den = (c * ms) ** 2 / df_seed + (c * kink) ** 2 / df_resid
    nu = se2**2 / (vt[None, :] ** 2 / (tasks - 1) + seed_den)
    measured = float(rejected(stdtrit(nu, q) * np.sqrt(se2)).mean())
    return truncated * unmeasured + (1 - truncated) * measured


def _power(
    effect: float,
    tasks: int,
    samples: float,
    seeds: float,
    baseline: float,
    flip_rate: float,
    alpha: float,
    within_flip_rate: float | None,
    effect_sd: float,
    seed_sd: float,
) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1) (got {alpha!r})")
    check_design(tasks, samples, seeds, baseline, flip_rate, within_flip_rate, effect_sd, seed_sd)
    if not -baseline <= effect <= 1 - baseline:
        raise ValueError(f"effect {effect:+g} would move the baseline {baseline:g} outside [0, 1]")
    if seeds < 2 or 2.0 ** (1 - tasks) > alpha:  # no verdict with one seed; the sign-flip test's floor is 2/2^T
        return 0.0
    v = difference_variance(
        effect, tasks, samples, seeds, baseline, flip_rate, within_flip_rate=within_flip_rate, effect_sd=effect_sd
    )
    cell = 0.0 if seeds == math.inf else seeds * (v - effect_sd**2) / 2  # per-cell variance, mean of both arms
    return _rule_power(effect, tasks, v, cell, seeds, seed_sd, alpha)


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
    seed_sd: float = DEFAULT_SEED_SD,
) -> float:
    """Probability that the verdict calls an effect of `effect` (a fraction: 0.065 = 6.5 points of pass^1) with T
    tasks, N samples and S seeds per arm, testing at `alpha` (module docstring). 0 with one seed per arm and when
    2/2^T > alpha. At effect 0 it is the rule's false-positive rate under the model (≤ alpha)."""
    args = (within_flip_rate, effect_sd, seed_sd)
    return _power(effect, tasks, samples, seeds, baseline, flip_rate, alpha, *args)


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
    seed_sd: float = DEFAULT_SEED_SD,
) -> float:
    """Minimum detectable effect: the smallest improvement δ > 0 (a fraction) over `baseline` that the verdict
    calls with probability `power` (see `power`); math.inf when no δ ≤ 1 − baseline reaches it (one seed per arm,
    too few tasks, too much noise)."""
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1) (got {power!r})")

    def gap(d: float) -> float:
        args = (within_flip_rate, effect_sd, seed_sd)
        return _power(d, tasks, samples, seeds, baseline, flip_rate, alpha, *args) - power

    top = 1 - baseline
    # Bracket around the normal approximation (the t quantiles and the effect's own variance only push it up).
    guess = _normal_mde(tasks, samples, seeds, baseline, flip_rate, alpha, power, within_flip_rate, seed_sd)
    lo = guess if 0 < guess < top and gap(guess) < 0 else 0.0
    hi = 2.2 * guess if lo > 0 and 2.2 * guess < top and gap(2.2 * guess) >= 0 else top
    if hi == top and gap(top) < 0:
        return math.inf
    return float(brentq(gap, lo, hi, xtol=1e-4))


def _normal_mde(
    tasks: float,
    samples: float,
    seeds: float,
    baseline: float,
    flip_rate: float,
    alpha: float,
    power: float,
    within_flip_rate: float | None,
    seed_sd: float,
) -> float:
    """(z_{1−α/2} + z_power) × the SD of the difference at no effect: where `mde` starts looking."""
    v = difference_variance(0.0, tasks, samples, seeds, baseline, flip_rate, within_flip_rate=within_flip_rate)
    sd = math.sqrt(v / tasks + (0.0 if seeds == math.inf else 2 * seed_sd**2 / seeds))
    return float((ndtri(1 - alpha / 2) + ndtri(power)) * sd)


@dataclass(frozen=True)
class DesignNeed:
    """What a target effect needs (see `required_design`).

    `seeds`: seeds per arm at the given samples per task (None: more than MAX_SEEDS). `samples`: samples per
    task at the given seeds (None: more than MAX_SAMPLES, unreachable because the seed components do not shrink
    with samples, or one seed per arm, which no number of samples turns into a verdict). `power_limit`: power
    with unlimited seeds and samples at this task count; `bounded_by_tasks`: True when even that is below the
    target — only more tasks help.
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
        """One sentence: `+6.5 points at 80% power needs 4 seeds per arm at 4 samples per task`."""
        pts = f"{self.effect * 100:+.1f} points at {self.target_power:.0%} power"
        if self.bounded_by_tasks:
            return (
                f"{pts}: not reachable with {self.tasks} tasks — at most {self.power_limit:.0%} power however "
                "many seeds and samples; add tasks"
            )
        parts = []
        if self.seeds is not None:
            parts.append(f"{_n(self.seeds, 'seed')} per arm at {_n(self.at_samples, 'sample')} per task")
        if self.samples is not None:
            parts.append(f"{_n(self.samples, 'sample')} per task at {_n(self.at_seeds, 'seed')} per arm")
        if not parts:
            return f"{pts}: needs more than {MAX_SEEDS} seeds per arm at {self.at_samples} samples per task"
        return f"{pts} needs " + ", or ".join(parts)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _smallest(check: Any, limit: int, start: int = 1) -> int | None:
    """Smallest m in 1..limit with check(m) (check monotone in m), or None: from `start` (a guess), doubling or
    halving to bracket it, then bisecting — a few checks when the guess is close."""
    hi = max(1, min(start, limit))
    if check(hi):
        lo = hi // 2
        while lo >= 1 and check(lo):
            hi, lo = lo, lo // 2
    else:
        lo = hi
        while True:
            if hi >= limit:
                return None
            hi = min(2 * hi, limit)
            if check(hi):
                break
            lo = hi
    while hi - lo > 1:  # check(lo) False (or lo = 0), check(hi) True
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
    seed_sd: float = DEFAULT_SEED_SD,
) -> DesignNeed:
    """Seeds per arm (at `samples` per task) and samples per task (at `seeds` per arm) that give `effect` the
    target power under the verdict's rule, or the statement that the task count bounds it (the limit of `power`
    as seeds and samples grow: V → σ_δ², no seed term)."""
    if effect == 0:
        raise ValueError("effect must be non-zero: no design has power against an effect of 0")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1) (got {power!r})")

    def pw(n: float, s: float) -> float:
        return _power(effect, tasks, n, s, baseline, flip_rate, alpha, within_flip_rate, effect_sd, seed_sd)

    limit = pw(math.inf, math.inf)
    if limit < power:
        return DesignNeed(effect, power, tasks, samples, seeds, None, None, limit, True)
    # Start where the normal approximation puts the seeds: its SD at one seed shrinks as 1/√S.
    at_one = _normal_mde(tasks, samples, 1, baseline, flip_rate, alpha, power, within_flip_rate, seed_sd)
    guess = max(2, math.ceil((at_one / abs(effect)) ** 2))
    need_seeds = _smallest(lambda s: pw(samples, s) >= power, MAX_SEEDS, min(guess, MAX_SEEDS))
    need_samples = _smallest(lambda n: pw(n, seeds) >= power, MAX_SAMPLES) if seeds >= 2 else None
    return DesignNeed(effect, power, tasks, samples, seeds, need_seeds, need_samples, limit, False)
