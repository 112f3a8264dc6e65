"""The test behind `longhaul compare`'s verdict: does configuration B differ from configuration A, counting the
noise of training seeds? (pure, deterministic: no random draws — the same runs give the same numbers.)

Model. Arm X's cell value (pass^k of one task under one seed) is v_X[s, t] = μ_X + β_t + δ_t + a_Xs + e_Xst:
task difficulty β_t (shared by both arms: the comparison is paired on the tasks both ran), the arm's effect on
the task δ_t (B only), a whole-seed shift a_Xs ~ (0, σ²_seed) shared by every task of one training run, and
everything that differs cell by cell e_Xst (a seed's luck on one task, the samples' Bernoulli noise). With
d_t = mean_s v_B[s, t] − mean_s v_A[s, t] and D = mean_t d_t = rate(B) − rate(A):

    Var(D) = Var(d_t − ā_B + ā_A) / T  +  σ²_seed · (1/S_A + 1/S_B)
             task part, estimated by s²(d)/T   seed part: the whole-seed shifts do not average over tasks

The whole-seed shifts are common to every d_t, so s²(d) does not contain them (T − 1 degrees of freedom). σ²_seed
is measured when an arm has ≥ 2 seeds: pooled over both arms by the method of moments, σ̂² = max(0, MS_α −
MS_γ/T) (`longhaul.eval.stats.outcomes.TwoWay`; S_A + S_B − 2 degrees of freedom). With one seed in each arm
nothing measures it: it is taken as `DEFAULT_SEED_SD` (an assumption, stated in the verdict). `longhaul compare`
gives a verdict only when both arms have ≥ 2 seeds (`ArmComparison.testable`).

Test. t = D / √V̂ with V̂ = s²(d)/T + σ̂²(1/S_A + 1/S_B), against Student's t with the Welch–Satterthwaite degrees
of freedom of the estimated parts — ν = V̂² / (V_task²/(T − 1) + (c·MS_α)²/df_α + (c·MS_γ/T)²/df_γ), c = 1/S_A +
1/S_B, the seed terms counted when σ̂² > 0: a seed variance read from 3 seeds per arm is itself noisy and the t_ν
quantile pays for it. The CI is D ± t_ν·√V̂ (dual to this p). The reported p is the larger of this p and the exact
sign-flip p over tasks (`longhaul.eval.stats.signflip`): a "better" needs both tests to reject — valid when either
is, exact when seeds do not shift whole runs, and never below 2/2^T however the variance estimate falls (tiny
task counts, all tasks moving alike). Calibration (type-I error, coverage, power at the printed MDE) is measured
through `longhaul.analysis.study.build_statistics` in tests/unit/tracking/test_compare_calibration.py.

Why an analytic interval rather than the hierarchical bootstrap of `longhaul.eval.stats.bootstrap` (which still
gives one arm's rates): it is dual to the test (the CI excludes 0 exactly when p_t < 1 − confidence), draws
nothing, and has a power model (`longhaul.eval.stats.planning`) for the rule it decides by.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import stdtr, stdtrit

from longhaul.eval.stats.defaults import ALPHA, DEFAULT_SEED_SD
from longhaul.eval.stats.outcomes import Outcomes, TwoWay, cell_values, common_tasks, rate
from longhaul.eval.stats.signflip import permutation_p_value


@dataclass(frozen=True)
class SeedNoise:
    """The whole-seed variance pooled over the arms with ≥ 2 seeds (module docstring): the pooled mean squares of
    the seed margins (MS_α, df_α = Σ(S − 1)) and of the residuals (MS_γ, df_γ = Σ(S − 1)(T − 1)), and σ̂²."""

    variance: float
    ms_seed: float
    df_seed: int
    ms_resid: float
    df_resid: int

    @classmethod
    def pooled(cls, tables: Sequence[np.ndarray]) -> SeedNoise | None:
        """From (seeds, tasks) cell tables on the same tasks; None when no table has two seeds."""
        parts = [TwoWay.of(v) for v in tables if v.shape[0] > 1]
        if not parts:
            return None
        df_seed, df_resid = sum(p.df_seed for p in parts), sum(p.df_resid for p in parts)
        ms_seed = sum(p.ms_seed * p.df_seed for p in parts) / df_seed
        ms_resid = sum(p.ms_resid * p.df_resid for p in parts) / df_resid if df_resid else 0.0
        tasks = parts[0].beta.size
        return cls(max(0.0, ms_seed - ms_resid / tasks), ms_seed, df_seed, ms_resid, df_resid)

    def df_terms(self, c: float, tasks: int) -> float:
        """The seed part's share of the Welch–Satterthwaite denominator, Σ (coef · MS)² / df, for the variance
        c · σ̂²; 0 when σ̂² is 0 (the seed part then adds nothing to estimate)."""
        if self.variance == 0:
            return 0.0
        out = (c * self.ms_seed) ** 2 / self.df_seed
        return out + ((c * self.ms_resid / tasks) ** 2 / self.df_resid if self.df_resid else 0.0)


@dataclass(frozen=True)
class ArmComparison:
    """Configuration B minus configuration A on the tasks both ran (module docstring).

    `diff` = rate(B) − rate(A); `ci` its interval at `confidence`; `p_value` = max(`p_t`, `p_sign_flip`); `se` =
    √V̂ (inf with one task: no test); `df` the t's degrees of freedom (inf: normal); `seed_sd` the whole-seed SD
    used, measured (`seed_sd_measured`) or assumed.
    """

    diff: float
    ci: tuple[float, float]
    p_value: float
    p_t: float
    p_sign_flip: float
    se: float
    df: float
    tasks: int
    seeds_a: int
    seeds_b: int
    rate_a: float
    rate_b: float
    seed_sd: float
    seed_sd_measured: bool
    confidence: float

    @property
    def testable(self) -> bool:
        """True when both arms have ≥ 2 seeds: only then can a verdict say one configuration is better."""
        return min(self.seeds_a, self.seeds_b) >= 2 and self.tasks >= 2

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: infinite or undefined numbers (one task, a normal reference) as null."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = [finite_or_none(x) for x in value]
            elif isinstance(value, float):
                value = finite_or_none(value)
            out[name] = value
        return out


def finite_or_none(x: float | None) -> float | None:
    """x, or None when it is None, infinite or NaN (JSON has no Infinity or NaN)."""
    return None if x is None or not math.isfinite(x) else float(x)


def compare_arms(
    a: Outcomes,
    b: Outcomes,
    k: int = 1,
    kind: str = "pass_hat",
    *,
    assumed_seed_sd: float = DEFAULT_SEED_SD,
    confidence: float = 1 - ALPHA,
) -> ArmComparison:
    """rate(B) − rate(A) on the common tasks with its CI and p-value, seed noise included (module docstring).
    `assumed_seed_sd` is the whole-seed SD used when neither arm has two seeds to measure it."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1) (got {confidence})")
    if assumed_seed_sd < 0:
        raise ValueError(f"assumed_seed_sd must be ≥ 0 (got {assumed_seed_sd})")
    a, b = common_tasks(a, b)
    va, vb = cell_values(a, k, kind), cell_values(b, k, kind)
    tasks, c = va.shape[1], 1 / va.shape[0] + 1 / vb.shape[0]
    noise = SeedNoise.pooled([va, vb])
    seed_var = assumed_seed_sd**2 if noise is None else noise.variance
    ra, rb = rate(a, k, kind), rate(b, k, kind)
    diff, p_sign_flip = rb - ra, permutation_p_value(a, b, k, kind)

    def result(ci: tuple[float, float], p_t: float, se: float, df: float) -> ArmComparison:
        return ArmComparison(
            diff=diff,
            ci=ci,
            p_value=max(p_t, p_sign_flip),
            p_t=p_t,
            p_sign_flip=p_sign_flip,
            se=se,
            df=df,
            tasks=tasks,
            seeds_a=va.shape[0],
            seeds_b=vb.shape[0],
            rate_a=ra,
            rate_b=rb,
            seed_sd=math.sqrt(seed_var),
            seed_sd_measured=noise is not None,
            confidence=confidence,
        )

    if tasks < 2:  # nothing measures how much one task's difference varies
        return result((-1.0, 1.0), 1.0, math.inf, math.inf)
    d = vb.mean(axis=0) - va.mean(axis=0)
    v_task = float(d.var(ddof=1)) / tasks
    v = v_task + c * seed_var
    den = v_task**2 / (tasks - 1) + (0.0 if noise is None else noise.df_terms(c, tasks))
    df = v * v / den if den > 0 else math.inf
    se = math.sqrt(v)
    if se == 0:  # every task moved by exactly the same amount in every seed
        return result((diff, diff), 1.0 if diff == 0 else 0.0, 0.0, df)
    half = float(stdtrit(df, (1 + confidence) / 2)) * se
    return result((max(diff - half, -1.0), min(diff + half, 1.0)), float(2 * stdtr(df, -abs(diff) / se)), se, df)
