"""Statistics for numbers you can trust (pure: no I/O, no clock; randomness only through an explicit
`numpy.random.Generator` argument, and only in the bootstrap CIs).

    defaults    α, target power, bootstrap size, the planning defaults (baseline, flip rate, seed SD) — one place
    outcomes    one arm's (seeds, tasks, samples) outcomes, per-cell pass^k / pass@k, rates, flip rates
    bootstrap   hierarchical-bootstrap CIs of a rate and of the paired difference of two checkpoints
    signflip    the exact paired sign-flip test over tasks (deterministic)
    arms        the verdict's test between configurations: tasks and training seeds as variance components
    planning    power, MDE and the design a target effect needs, for that verdict's rule
    design      a comparison's design as a file (`design.json`, `longhaul power --from-comparison`)
    verdict     Holm's correction and the one-line verdict

The names below are the package's API; each lives in one of those modules.
"""

from longhaul.eval.stats.arms import ArmComparison, SeedNoise, compare_arms, finite_or_none
from longhaul.eval.stats.bootstrap import PairedResult, bootstrap_ci, paired_difference
from longhaul.eval.stats.defaults import (
    ALPHA,
    BOOTSTRAP_SAMPLES,
    DEFAULT_BASELINE,
    DEFAULT_FLIP_RATE,
    DEFAULT_SEED_SD,
    MAX_SAMPLES,
    MAX_SEEDS,
    POWER,
)
from longhaul.eval.stats.design import StudyDesign
from longhaul.eval.stats.outcomes import (
    KINDS,
    Outcomes,
    TwoWay,
    cell_values,
    common_tasks,
    flip_rate,
    rate,
    task_differences,
    within_seed_flip_rate,
)
from longhaul.eval.stats.planning import DesignNeed, difference_variance, mde, power, required_design
from longhaul.eval.stats.signflip import permutation_p_value, sign_flip_p_value
from longhaul.eval.stats.verdict import CORRECTION, holm, verdict

__all__ = [
    "ALPHA",
    "BOOTSTRAP_SAMPLES",
    "CORRECTION",
    "DEFAULT_BASELINE",
    "DEFAULT_FLIP_RATE",
    "DEFAULT_SEED_SD",
    "KINDS",
    "MAX_SAMPLES",
    "MAX_SEEDS",
    "POWER",
    "ArmComparison",
    "DesignNeed",
    "Outcomes",
    "PairedResult",
    "SeedNoise",
    "StudyDesign",
    "TwoWay",
    "bootstrap_ci",
    "cell_values",
    "common_tasks",
    "compare_arms",
    "difference_variance",
    "finite_or_none",
    "flip_rate",
    "holm",
    "mde",
    "paired_difference",
    "permutation_p_value",
    "power",
    "rate",
    "required_design",
    "sign_flip_p_value",
    "task_differences",
    "verdict",
    "within_seed_flip_rate",
]
