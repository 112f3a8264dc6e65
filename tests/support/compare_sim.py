"""Simulated two-arm studies with a known truth, for the calibration of `longhaul compare`'s statistics
(tests/unit/tracking/test_compare_calibration.py, and the larger run of benchmarks/calibrate_compare.py).

Every simulated study goes through the real path: outcomes → `TrialRecord`s → `Arm`s → `build_statistics`, and
the rates are read from its comparisons (the overall one, and the verdicts of the whole family).

Two generators:

- `logit` (type-I error, coverage, false claims): τ²-airline-like. Task t has logit difficulty μ_t ~ N(m, τ²);
  a seed adds a whole-run shift a_s ~ N(0, σ_a²) (with `seed_shift`) and a seed × task shift b_st ~ N(0, σ_b²);
  each sample is Bernoulli(expit(μ_t + δ + a_s + b_st)), δ the effect of arm B. m, τ, σ_b give pass^1 ≈ 0.175
  and a flip rate ≈ 0.16 (the defaults of `longhaul.eval.stats.defaults`); σ_a = 0.3 is a whole-seed SD of
  ≈ 2.4 points of pass^1, the default seed SD. Tasks and seeds are drawn afresh in every study, so the truth is
  the population difference E[expit(m + δ + sZ)] − E[expit(m + sZ)], s² = τ² + σ_a² + σ_b² (Gauss–Hermite).
- `planning` (power at the printed MDE): the model `longhaul power` plans with — task rates p_t from a two-point
  distribution with mean b and 2E[p(1 − p)] = f, a whole-seed shift N(0, σ_seed²) on every task of a seed, arm B
  every rate + δ, Bernoulli samples (rates clipped to [0, 1], which the layouts used almost never need).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from longhaul.analysis.study import Arm, SeedEval, build_statistics
from longhaul.eval import stats
from longhaul.eval.metrics import TrialRecord

M, TAU, SIGMA_B = -2.99, 2.63, 0.5  # pass^1 ≈ 0.175, flip rate ≈ 0.16
SIGMA_A = 0.3  # whole-seed logit SD ≈ 2.4 points of pass^1 at this baseline
PLAN_BASELINE, PLAN_FLIP = 0.175, 0.16


@dataclass(frozen=True)
class Layout:
    """A study: T tasks (the last `test_tasks` of them in subset "test", the others in "train"; none: only
    "overall"), S seeds per arm, N samples per task and seed, with or without a whole-seed shift."""

    tasks: int
    seeds: int
    samples: int = 4
    seed_shift: bool = False
    test_tasks: int = 0

    @property
    def key(self) -> str:
        """A short ASCII name (test ids): `50t-3s-shift-10test`."""
        parts = [f"{self.tasks}t", f"{self.seeds}s", "shift" if self.seed_shift else "noshift"]
        return "-".join(parts + ([f"{self.test_tasks}test"] if self.test_tasks else []))

    def __str__(self) -> str:
        shift = "shift" if self.seed_shift else "no shift"
        split = f", {self.test_tasks} of them test" if self.test_tasks else ""
        return f"{self.tasks} tasks{split} × {self.seeds} seed(s) × {self.samples} samples, {shift}"


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def truth(delta: float, seed_shift: bool) -> float:
    """The population pass^1 difference of the `logit` generator for a logit effect `delta`."""
    x, w = np.polynomial.hermite.hermgauss(200)
    s = math.sqrt(TAU**2 + (SIGMA_A**2 if seed_shift else 0.0) + SIGMA_B**2)

    def mean(m: float) -> float:
        return float((w * _expit(m + s * math.sqrt(2) * x)).sum() / math.sqrt(math.pi))

    return mean(M + delta) - mean(M)


def _arm(label: str, outcomes: np.ndarray, layout: Layout) -> Arm:
    """An arm from a (seeds, tasks, samples) boolean array, its tasks split into train/test as `layout` says."""
    first_test = layout.tasks - layout.test_tasks
    names = [() if not layout.test_tasks else ("test",) if t >= first_test else ("train",) for t in range(layout.tasks)]
    seeds = []
    for s in range(outcomes.shape[0]):
        recs = tuple(
            TrialRecord(str(t), j, bool(outcomes[s, t, j]), names[t])
            for t in range(outcomes.shape[1])
            for j in range(outcomes.shape[2])
        )
        seeds.append(SeedEval(s + 1, f"{label}-s{s + 1}", 100, "last evaluated", recs))
    return Arm(label, label, "grpo", tuple(seeds))


def logit_study(rng: np.random.Generator, layout: Layout, delta: float = 0.0) -> tuple[Arm, Arm]:
    """Arms A and B of one study from the `logit` generator (module docstring)."""
    mu = rng.normal(M, TAU, layout.tasks)
    arms = []
    for label, shift in (("A", 0.0), ("B", delta)):
        a = rng.normal(0.0, SIGMA_A if layout.seed_shift else 0.0, (layout.seeds, 1))
        b = rng.normal(0.0, SIGMA_B, (layout.seeds, layout.tasks))
        p = _expit(mu[None, :] + shift + a + b)
        arms.append(_arm(label, rng.random((layout.seeds, layout.tasks, layout.samples)) < p[:, :, None], layout))
    return arms[0], arms[1]


def planning_study(
    rng: np.random.Generator, layout: Layout, delta: float, seed_sd: float, baseline: float, flip: float
) -> tuple[Arm, Arm]:
    """Arms A and B of one study from the `planning` generator (module docstring): the two task rates lie ≥ 3
    seed SDs inside [0, 1] where the variance allows (symmetric about the baseline otherwise)."""
    var_p = baseline * (1 - baseline) - flip / 2
    lo = max(baseline - math.sqrt(var_p), min(3 * seed_sd + 0.005, baseline / 2))
    gap = (baseline - lo) + var_p / (baseline - lo)
    p = np.where(rng.random(layout.tasks) < (baseline - lo) / gap, lo + gap, lo)
    arms = []
    for label, shift in (("A", 0.0), ("B", delta)):
        q = np.clip(p[None, :] + shift + rng.normal(0.0, seed_sd, (layout.seeds, 1)), 0.0, 1.0)
        arms.append(_arm(label, rng.random((layout.seeds, layout.tasks, layout.samples)) < q[:, :, None], layout))
    return arms[0], arms[1]


def planned_mde(layout: Layout, seed_sd: float, baseline: float = PLAN_BASELINE, flip: float = PLAN_FLIP) -> float:
    """The MDE `longhaul power` gives the `planning` generator's design (one comparison: no subsets)."""
    return stats.mde(layout.tasks, layout.samples, layout.seeds, baseline, flip, seed_sd=seed_sd)


@dataclass(frozen=True)
class Rates:
    """What `measure` counted over `sims` studies: the overall comparison's p < α (`rejections`), its exact
    sign-flip p alone < α (`task_only_rejections`: what a test blind to whole-seed shifts would say), its 95% CI
    covering the truth (`covered`), a "better" verdict anywhere in the family (`claims`) and on the overall
    comparison (`overall_claims`), and the overall comparison's printed MDEs."""

    sims: int
    rejections: int
    task_only_rejections: int
    covered: int
    claims: int
    overall_claims: int
    mdes: tuple[float, ...]

    @property
    def rejection_rate(self) -> float:
        """Share of studies whose overall p < α (type-I error under the null, else the test's power)."""
        return self.rejections / self.sims

    @property
    def task_only_rate(self) -> float:
        """Share of studies whose overall sign-flip p alone < α."""
        return self.task_only_rejections / self.sims

    @property
    def coverage(self) -> float:
        """Share of studies whose overall 95% CI covers the truth."""
        return self.covered / self.sims

    @property
    def claim_rate(self) -> float:
        """Share of studies with at least one "better" verdict (the family-wise false-claim rate under the null)."""
        return self.claims / self.sims

    @property
    def overall_claim_rate(self) -> float:
        """Share of studies whose overall verdict says B (or A) is better."""
        return self.overall_claims / self.sims

    def mc_se(self, rate: float) -> float:
        """The Monte Carlo standard error of a rate measured over these studies."""
        return math.sqrt(rate * (1 - rate) / self.sims)


def measure(studies: list[tuple[Arm, Arm]], true_diff: float) -> Rates:
    """`build_statistics` on every study; the rates of `Rates`."""
    rejections = task_only = covered = claims = overall_claims = 0
    mdes = []
    for a, b in studies:
        st = build_statistics([a, b], [1])
        overall = st.comparisons[0]
        assert overall.subset == "overall"
        rejections += overall.result.p_value < stats.ALPHA
        task_only += overall.result.p_sign_flip < stats.ALPHA
        lo, hi = overall.result.ci
        covered += lo <= true_diff <= hi
        claims += any(c.better is not None for c in st.comparisons)
        overall_claims += overall.better is not None
        mdes.append(math.inf if overall.mde is None else overall.mde)
    return Rates(len(studies), rejections, task_only, covered, claims, overall_claims, tuple(mdes))


def null_rates(layout: Layout, sims: int, seed: int) -> Rates:
    """`measure` on `sims` null studies of the `logit` generator."""
    rng = np.random.default_rng(seed)
    return measure([logit_study(rng, layout) for _ in range(sims)], 0.0)


def effect_rates(layout: Layout, delta: float, sims: int, seed: int) -> Rates:
    """`measure` on `sims` studies of the `logit` generator with a logit effect `delta` (coverage of its truth)."""
    rng = np.random.default_rng(seed)
    return measure([logit_study(rng, layout, delta) for _ in range(sims)], truth(delta, layout.seed_shift))


def power_rates(
    layout: Layout, seed_sd: float, sims: int, seed: int, baseline: float = PLAN_BASELINE, flip: float = PLAN_FLIP
) -> tuple[float, Rates]:
    """(the planned MDE, `measure` on `sims` studies of the `planning` generator with that effect)."""
    delta = planned_mde(layout, seed_sd, baseline, flip)
    rng = np.random.default_rng(seed)
    studies = [planning_study(rng, layout, delta, seed_sd, baseline, flip) for _ in range(sims)]
    return delta, measure(studies, delta)
