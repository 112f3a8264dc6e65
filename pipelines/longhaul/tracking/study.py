"""The statistics of `longhaul compare` (pure): arms = seed groups, each seed at one checkpoint, and the rates,
CIs, flip rates, paired differences, MDEs and verdicts of `longhaul.eval.stats` over seeds × tasks × samples.

Input is built by `longhaul.tracking.compare` from MLflow (training runs, their evaluated checkpoints and the
per-trial results JSONL of each evaluation); nothing here talks to MLflow, so the report can be tested from
literal values.

Which runs form an arm: the seed runs of one multi-seed Experiment (tag `longhaul.seed_group`), or a single
training run on its own. Which checkpoint of each seed: the one selected on the run's `select_on` subset
(never a test subset; `longhaul.tracking.selection`), else the last evaluated one — the table says which.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from longhaul.eval import stats
from longhaul.eval.metrics import TrialRecord, incomplete_tasks
from longhaul.tracking import tags as T
from longhaul.tracking.ablation import SUBSET_ORDER, EvalPoint, RunRecord, select_point

OVERALL = "overall"
#: The comparison's randomness is fixed: the same runs give the same table.
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
class Comparison:
    """Arm B against arm A on one subset (pass^1, paired on the tasks both ran)."""

    a: str
    b: str
    subset: str
    result: stats.PairedResult
    mde: float
    verdict: str


@dataclass(frozen=True)
class Statistics:
    arms: tuple[Arm, ...]
    rows: tuple[RateRow, ...]
    comparisons: tuple[Comparison, ...]
    problems: tuple[str, ...] = ()
    design: stats.StudyDesign | None = None
    ks: tuple[int, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`statistics.json`)."""
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
            "comparisons": [
                {"a": c.a, "b": c.b, "subset": c.subset, **c.result.to_dict(), "mde": c.mde, "verdict": c.verdict}
                for c in self.comparisons
            ],
            "problems": list(self.problems),
            "design": None if self.design is None else json.loads(self.design.to_json()),
        }


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


def _noise(o: stats.Outcomes, baseline: float) -> float:
    """The flip rate the MDE assumes: the baseline arm's between-seed flip rate, else its within-seed one,
    else the default of `longhaul.eval.stats`; at most 2·b·(1−b), what independent runs at rate b reach
    (a small arm can measure more by chance)."""
    measured = stats.flip_rate(o)
    if measured is None:
        measured = stats.within_seed_flip_rate(o)
    f = stats.DEFAULT_FLIP_RATE if measured is None else measured
    return min(f, 2 * baseline * (1 - baseline))


def build_statistics(
    arms: Sequence[Arm], ks: Sequence[int], floor: Mapping[str, float] | None = None, *, problems: Sequence[str] = ()
) -> Statistics:
    """Rates with hierarchical-bootstrap CIs per arm and subset, and a paired comparison of every pair of arms
    per shared subset (B − A in arm order). An arm whose seeds were evaluated on different designs is reported
    in `problems` and left out; so is a k above an arm's samples per task."""
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
        for subset, o in per_subset.items():
            valid = [k for k in ks if k <= o.samples] or [1]
            tasks = o.tasks
            vals = [floor[t] for t in tasks if floor and t in floor]
            rows.append(
                RateRow(
                    arm=arm.label,
                    subset=subset,
                    seeds=len(o.seeds),
                    tasks=len(tasks),
                    samples=o.samples,
                    pass_hat={k: _rate(o, k, "pass_hat", rng) for k in valid},
                    pass_at={k: _rate(o, k, "pass_at", rng) for k in valid if k > 1},
                    flip_rate=stats.flip_rate(o),
                    null_floor=sum(vals) / len(vals) if vals and len(vals) == len(tasks) else None,
                )
            )
    comparisons: list[Comparison] = []
    for (a, oa), (b, ob) in combinations(usable, 2):
        for subset in [s for s in oa if s in ob]:
            try:
                result = stats.paired_difference(oa[subset], ob[subset], 1, "pass_hat", rng)
            except ValueError as exc:
                problems.append(f"{b.label} vs {a.label} on {subset}: {exc}")
                continue
            design_seeds = min(len(oa[subset].seeds), len(ob[subset].seeds))
            samples = min(oa[subset].samples, ob[subset].samples)
            baseline = _clip(result.rate_a)
            m = stats.mde(
                result.tasks, samples, design_seeds, baseline=baseline, flip_rate=_noise(oa[subset], baseline)
            )
            comparisons.append(
                Comparison(a.label, b.label, subset, result, m, stats.verdict(result, m, a=a.label, b=b.label))
            )
    design = None
    if usable:
        try:
            design = stats.StudyDesign.from_outcomes(usable[0][1][OVERALL])
        except ValueError as exc:
            problems.append(f"no study design for `longhaul power`: {exc}")
    return Statistics(tuple(a for a, _ in usable), tuple(rows), tuple(comparisons), tuple(problems), design, tuple(ks))


def _clip(p: float) -> float:
    # A baseline of exactly 0 or 1 has no Bernoulli variance; the power model needs it inside (0, 1).
    return min(max(p, 0.01), 0.99)


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _rate_cell(r: Rate | None) -> str:
    return "—" if r is None else f"{r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]"


def render_statistics_markdown(st: Statistics) -> str:
    """The statistics section printed after the ablation table."""
    ks_hat = sorted({k for r in st.rows for k in r.pass_hat})
    ks_at = sorted({k for r in st.rows for k in r.pass_at})
    lines = ["", "## Statistics over seeds × tasks × samples", ""]
    for arm in st.arms:
        seeds = ", ".join(f"s{s.seed} step {s.step} ({s.chosen})" for s in arm.seeds)
        lines.append(f"- {arm.label} ({arm.method}): {len(arm.seeds)} seed(s): {seeds}")
    lines += [
        "",
        "95% CIs: hierarchical bootstrap (tasks, then seeds). Flip rate: share of outcomes that differ "
        "between two seeds of the arm. Null floor: the do-nothing agent on the same tasks.",
        "",
    ]
    head = ["arm", "subset", "seeds", "tasks", "n/task"] + [f"pass^{k} [95% CI]" for k in ks_hat]
    head += [f"pass@{k} [95% CI]" for k in ks_at] + ["flip rate", "null floor"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    for r in st.rows:
        cells = [r.arm, r.subset, str(r.seeds), str(r.tasks), str(r.samples)]
        cells += [_rate_cell(r.pass_hat.get(k)) for k in ks_hat] + [_rate_cell(r.pass_at.get(k)) for k in ks_at]
        cells += [_pct(r.flip_rate), _pct(r.null_floor)]
        lines.append("| " + " | ".join(cells) + " |")
    if st.comparisons:
        lines += [
            "",
            "### Paired comparisons (pass^1, B − A on the tasks both ran; permutation p; MDE at 80% power)",
            "",
        ]
        lines += [f"- {c.b} vs {c.a}, {c.subset}: {c.verdict}" for c in st.comparisons]
    if st.problems:
        lines += ["", "### Not compared", ""] + [f"- {p}" for p in st.problems]
    return "\n".join(lines) + "\n"
