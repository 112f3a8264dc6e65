"""Verdicts (pure): Holm's correction over a family of comparisons, and the one line `longhaul compare` prints for
each comparison.

The rule. B is "better than" A (or A than B) only when both arms have ≥ 2 seeds — so the whole-seed noise was
measured, not assumed — and the comparison's p-value (`longhaul.eval.stats.arms`), Holm-adjusted over the family
of every comparison in the table, is below α. Otherwise the line says what was seen and why it is no verdict:
"not distinguishable from noise", one seed in an arm (with the seeds a design needs to see a difference of that
size), or a single task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from longhaul.eval.stats.arms import ArmComparison
from longhaul.eval.stats.defaults import ALPHA
from longhaul.eval.stats.planning import DesignNeed

CORRECTION = "Holm"


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the i-th smallest of m is multiplied by m − i + 1,
    then made monotone; "adjusted p < α" controls the chance of any false claim in the family at α, whatever the
    dependence between the comparisons (Holm 1979)."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return []
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, p[order] * (p.size - np.arange(p.size)))
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in adjusted]


def points(x: float) -> str:
    """A fraction as signed percentage points with a true minus: 0.041 → "+4.1", −0.09 → "−9.0"."""
    return f"{x * 100:+.1f}".replace("-", "−")


def _p(p: float) -> str:
    return f"{p:.2g}"


def _ci(result: ArmComparison) -> str:
    lo, hi = result.ci
    return f"[{points(lo).lstrip('+')}, {points(hi).lstrip('+')}]"


def mde_text(mde: float | None) -> str:
    """ "8.7" (points), or "n/a" when there is none."""
    return "n/a" if mde is None or not math.isfinite(mde) else f"{mde * 100:.1f}"


def verdict(
    result: ArmComparison,
    *,
    p_adjusted: float,
    mde: float | None,
    needs: DesignNeed | None,
    alpha: float = ALPHA,
    a: str = "A",
    b: str = "B",
) -> tuple[str | None, str]:
    """(the label of the better arm or None, the line). The line for a comparison that can give a verdict:
    `+4.1 points [−2.0, 10.3], p = 0.21 (Holm 0.42), MDE 8.7: not distinguishable from noise`; `needs` is what a
    design needs to see a difference of this size (named when an arm has one seed)."""
    if result.tasks < 2:
        return None, (
            f"{points(result.diff)} points on {result.tasks} task: no test — one task cannot show how much a "
            "task's difference varies; compare on ≥ 6 tasks (the fewest for which p < 0.05 is possible)"
        )
    head = f"{points(result.diff)} points {_ci(result)}, p = {_p(result.p_value)}"
    if not result.testable:
        single = [name for name, s in ((a, result.seeds_a), (b, result.seeds_b)) if s < 2]
        seeds = (
            f"seed SD {result.seed_sd * 100:.1f} points measured on the other arm's seeds"
            if result.seed_sd_measured
            else f"seed SD {result.seed_sd * 100:.1f} points assumed"
        )
        seen = "no difference seen" if result.diff == 0 or needs is None else needs.describe()
        return None, (
            f"{head} ({seeds}): no verdict — {' and '.join(single)} {'has' if len(single) == 1 else 'have'} one "
            f"seed, and a single seed cannot tell a better method from a luckier training run; {seen}"
        )
    head += f" ({CORRECTION} {_p(p_adjusted)}), MDE {mde_text(mde)}"
    if p_adjusted < alpha and result.diff != 0:
        better, worse = (b, a) if result.diff > 0 else (a, b)
        return better, f"{head}: {better} better than {worse}"
    return None, f"{head}: not distinguishable from noise"
