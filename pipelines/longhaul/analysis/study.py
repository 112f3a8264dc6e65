"""The statistics of `longhaul compare` (pure): arms = seed groups, each seed at one checkpoint, and the rates,
CIs, flip rates, paired differences, MDEs and verdicts of `longhaul.eval.stats` over seeds × tasks × samples.

Input is built by `longhaul.tracking.compare` from MLflow (training runs, their evaluated checkpoints and the
per-trial results JSONL of each evaluation); nothing here talks to MLflow, so the report can be tested from
literal values. The comparisons and their verdicts are `longhaul.analysis.verdicts`; the markdown is
`longhaul.analysis.study_render`.

Which runs form an arm: the seed runs of one multi-seed Experiment (tag `longhaul.seed_group`), or a single
training run on its own. Which checkpoint of each seed: the one selected on the run's `select_on` subset
(never a test subset; `longhaul.analysis.selection`), else the last evaluated one — the table says which.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longhaul.analysis import tags as T
from longhaul.analysis.ablation import SUBSET_ORDER, EvalPoint, RunRecord, select_point
from longhaul.analysis.verdicts import Comparison, build_comparisons
from longhaul.eval import stats
from longhaul.eval.metrics import TrialRecord, incomplete_tasks

OVERALL = "overall"
#: The bootstrap of the rates' CIs draws from a generator seeded with this: the same runs give the same table.
#: (The comparisons draw nothing: their p-values and CIs are exact or analytic.)
RNG_SEED = 0


@dataclass(frozen=True)
class SeedEval:
    """One seed run of an arm at the checkpoint its statistics use, with that evaluation's trial records."""

    seed: int
    run_name: str
    step: int
    chosen: str  # "selected on <subset>" or "last evaluated"
    records: tuple[TrialRecord, ...]


@dataclass(frozen=True)
class Arm:
    """A configuration: its label (spec name), method and the evaluations of its seeds."""

    key: str
    label: str
    method: str
    seeds: tuple[SeedEval, ...]


def arm_key(record: RunRecord) -> str:
    """Seed runs of one Experiment share their group's run name; any other run is an arm on its own."""
    return record.tags.get(T.SEED_GROUP) or record.run_name


def group_arms(records: Sequence[RunRecord]) -> list[tuple[str, list[RunRecord]]]:
    """Training runs grouped into arms, ordered by label then key; runs of an arm by seed."""
    arms: dict[str, list[RunRecord]] = {}
    for r in records:
        arms.setdefault(arm_key(r), []).append(r)
    ordered = sorted(arms.items(), key=lambda kv: (kv[1][0].label, kv[0]))
    return [(k, sorted(rs, key=lambda r: (seed_of(r, 0), r.run_name))) for k, rs in ordered]


def seed_of(record: RunRecord, default: int) -> int:
    """The run's training seed (tag `longhaul.seed`); `default` for runs logged before the tag existed."""
    value = record.tags.get(T.SEED, "")
    return int(value) if value.isdigit() else default


def choose_point(record: RunRecord) -> tuple[EvalPoint, str] | None:
    """The checkpoint a run contributes: selected on its `select_on` subset, else its last evaluated one."""
    chosen = select_point(record)
    if chosen is not None:
        return chosen, f"selected on {record.tags.get(T.SELECT_ON) or 'train'}"
    if not record.points:
        return None
    return max(record.points, key=lambda p: p.step), "last evaluated"


# ---------------------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True)
class Rate:
    """A rate and its 95% CI."""

    value: float
    lo: float
    hi: float


@dataclass(frozen=True)
class RateRow:
    """One arm on one subset."""

    arm: str
    subset: str
    seeds: int
    tasks: int
    samples: int
    pass_hat: dict[int, Rate]
    pass_at: dict[int, Rate]
    flip_rate: float | None
    null_floor: float | None


@dataclass(frozen=True)
class Statistics:
    """What `longhaul compare` reports below the ablation table (`statistics.md`, `statistics.json`)."""

    arms: tuple[Arm, ...]
    rows: tuple[RateRow, ...]
    comparisons: tuple[Comparison, ...]
    problems: tuple[str, ...] = ()
    design: stats.StudyDesign | None = None
    ks: tuple[int, ...] = field(default_factory=tuple)
    alpha: float = stats.ALPHA

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`statistics.json`): strict JSON — an undefined number is null, never NaN/Infinity."""
        return {
            "arms": [
                {
                    "label": a.label,
                    "key": a.key,
                    "method": a.method,
                    "seeds": [
                        {"seed": s.seed, "run": s.run_name, "step": s.step, "checkpoint": s.chosen} for s in a.seeds
                    ],
                }
                for a in self.arms
            ],
            "rates": [
                {
                    "arm": r.arm,
                    "subset": r.subset,
                    "seeds": r.seeds,
                    "tasks": r.tasks,
                    "samples": r.samples,
                    "pass_hat_k": {str(k): vars(v) for k, v in r.pass_hat.items()},
                    "pass_at_k": {str(k): vars(v) for k, v in r.pass_at.items()},
                    "flip_rate": r.flip_rate,
                    "null_agent_floor": r.null_floor,
                }
                for r in self.rows
            ],
            "multiplicity": {
                "correction": stats.CORRECTION,
                "family": len(self.comparisons),
                "alpha": self.alpha,
                "members": "every pair of arms on every subset both ran (the comparisons below)",
            },
            "comparisons": [c.to_dict() for c in self.comparisons],
            "problems": list(self.problems),
            "design": None if self.design is None else json.loads(self.design.to_json()),
        }

    def to_json(self) -> str:
        """`statistics.json`'s text; ValueError rather than invalid JSON should a non-finite number slip in."""
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"


def arm_outcomes(arm: Arm, subset: str = OVERALL) -> stats.Outcomes:
    """The arm's (seed, task, sample) outcomes, on one subset (ValueError when the seeds' designs differ). A task
    with an unscored trial in any seed is left out of every seed (`longhaul.eval.metrics.incomplete_tasks`)."""
    drop = incomplete_tasks(r for s in arm.seeds for r in s.records)
    rows = [
        (s.seed, r.task_id, r.trial, r.success)
        for s in arm.seeds
        for r in s.records
        if (subset == OVERALL or subset in r.subsets) and r.task_id not in drop
    ]
    return stats.Outcomes.from_records(rows)


def subsets_of(arm: Arm) -> list[str]:
    """`overall`, then the arm's subsets in report order."""
    found = {name for s in arm.seeds for r in s.records for name in r.subsets}
    known = [s for s in SUBSET_ORDER if s in found]
    return [OVERALL, *known, *sorted(found - set(known))]


def _rate(o: stats.Outcomes, k: int, kind: str, rng: np.random.Generator) -> Rate:
    lo, hi = stats.bootstrap_ci(o, k, kind, rng)
    return Rate(stats.rate(o, k, kind), lo, hi)


def _rate_row(
    label: str,
    subset: str,
    o: stats.Outcomes,
    ks: Sequence[int],
    floor: Mapping[str, float] | None,
    rng: np.random.Generator,
) -> RateRow:
    valid = [k for k in ks if k <= o.samples] or [1]
    vals = [floor[t] for t in o.tasks if floor and t in floor]
    return RateRow(
        arm=label,
        subset=subset,
        seeds=len(o.seeds),
        tasks=len(o.tasks),
        samples=o.samples,
        pass_hat={k: _rate(o, k, "pass_hat", rng) for k in valid},
        pass_at={k: _rate(o, k, "pass_at", rng) for k in valid if k > 1},
        flip_rate=stats.flip_rate(o),
        null_floor=sum(vals) / len(vals) if vals and len(vals) == len(o.tasks) else None,
    )


def build_statistics(
    arms: Sequence[Arm],
    ks: Sequence[int],
    floor: Mapping[str, float] | None = None,
    *,
    problems: Sequence[str] = (),
    alpha: float = stats.ALPHA,
) -> Statistics:
    """Rates with hierarchical-bootstrap CIs per arm and subset, and the comparisons of every pair of arms on every
    shared subset (B − A in arm order; `longhaul.analysis.verdicts`), Holm-corrected together. An arm whose seeds
    were evaluated on different designs is reported in `problems` and left out; so is a k above an arm's samples
    per task (its pass^k and pass@k are not computed, and `problems` says so)."""
    rng = np.random.default_rng(RNG_SEED)
    rows: list[RateRow] = []
    problems = list(problems)
    usable: list[tuple[Arm, dict[str, stats.Outcomes]]] = []
    for arm in arms:
        try:
            per_subset = {s: arm_outcomes(arm, s) for s in subsets_of(arm)}
        except ValueError as exc:
            problems.append(f"{arm.label} ({arm.key}): left out — {exc}")
            continue
        usable.append((arm, per_subset))
        n = per_subset[OVERALL].samples
        above = [k for k in ks if k > n]
        if above:
            shown = ", ".join(str(k) for k in above)
            problems.append(
                f"{arm.label} ({arm.key}): pass^k and pass@k for k = {shown} not reported — its evaluations have "
                f"{n} sample(s) per task and k needs at most that many; evaluate with ≥ {max(above)} samples"
            )
        rows += [_rate_row(arm.label, subset, o, ks, floor, rng) for subset, o in per_subset.items()]
    comparisons, failed = build_comparisons([(a.label, o) for a, o in usable], alpha)
    problems += failed
    design = comparisons[0].design if comparisons else None
    if design is None and usable:
        try:
            design = stats.StudyDesign.from_outcomes(usable[0][1][OVERALL])
        except ValueError as exc:
            problems.append(f"no study design for `longhaul power`: {exc}")
    arms_used = tuple(a for a, _ in usable)
    return Statistics(arms_used, tuple(rows), tuple(comparisons), tuple(problems), design, tuple(ks), alpha)
