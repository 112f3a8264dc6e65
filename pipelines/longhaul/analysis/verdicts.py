"""The comparisons of `longhaul compare` (pure): every pair of arms on every subset both ran, each tested with
`longhaul.eval.stats.compare_arms` (tasks and training seeds as variance components), all corrected together
with Holm's method — the family is every comparison in the table —, each with the MDE of its own design under
that rule and its one-line verdict (`longhaul.eval.stats.verdict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from longhaul.eval import stats


@dataclass(frozen=True)
class Comparison:
    """Arm B against arm A on one subset (pass^1, paired on the tasks both ran): the test, its Holm-adjusted p, the
    design it had (`design.json` for the first), the MDE of that design (None: no verdict possible — an arm with
    one seed, A at 100%, an effect no size of which the design sees at 80% power) and the verdict."""

    a: str
    b: str
    subset: str
    result: stats.ArmComparison
    p_adjusted: float
    design: stats.StudyDesign
    mde: float | None
    better: str | None
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (one entry of `statistics.json`'s `comparisons`)."""
        return {
            "a": self.a,
            "b": self.b,
            "subset": self.subset,
            **self.result.to_dict(),
            "p_holm": self.p_adjusted,
            "mde": stats.finite_or_none(self.mde),
            "better": self.better,
            "verdict": self.verdict,
        }


def _mde(result: stats.ArmComparison, design: stats.StudyDesign) -> float | None:
    """The MDE of a comparison that can give a verdict; None when it cannot, or when A is at 100% (nothing above
    it to detect; its measured noise is 0, which would print a meaningless MDE of 0.0)."""
    if not result.testable or result.rate_a >= 1 - 1e-12:
        return None
    return stats.finite_or_none(design.mde())


def _needs(result: stats.ArmComparison, design: stats.StudyDesign) -> stats.DesignNeed | None:
    """What a design needs to see a difference of the size this comparison saw (None: it saw none)."""
    size = min(abs(result.diff), 1 - design.baseline)
    if size <= 0 or result.tasks < 2:
        return None
    return stats.required_design(size, alpha=design.alpha(), **design.planning())


def build_comparisons(
    arms: Sequence[tuple[str, Mapping[str, stats.Outcomes]]], alpha: float = stats.ALPHA
) -> tuple[list[Comparison], list[str]]:
    """Every pair of arms (B − A in the given order) on every subset both have, and the problems of pairs that
    could not be compared. `arms`: (label, {subset: outcomes}) in report order."""
    tested, problems = [], []
    for (a, oa), (b, ob) in combinations(arms, 2):
        for subset in [s for s in oa if s in ob]:
            try:
                tested.append((a, b, subset, oa[subset], ob[subset], stats.compare_arms(oa[subset], ob[subset])))
            except ValueError as exc:
                problems.append(f"{b} vs {a} on {subset}: {exc}")
    adjusted = stats.holm([t[-1].p_value for t in tested])
    out = []
    for (a, b, subset, oa, ob, result), p_adj in zip(tested, adjusted, strict=True):
        design = stats.StudyDesign.for_comparison(oa, ob, result, len(tested))
        mde = _mde(result, design)
        needs = None if result.testable else _needs(result, design)
        better, line = stats.verdict(result, p_adjusted=p_adj, mde=mde, needs=needs, alpha=alpha, a=a, b=b)
        out.append(Comparison(a, b, subset, result, p_adj, design, mde, better, line))
    return out, problems
