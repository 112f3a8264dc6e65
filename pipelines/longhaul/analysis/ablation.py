"""The ablation table: training runs × evaluated checkpoints → rows, markdown and CSV (pure).

Input records are built from MLflow by `longhaul.tracking.compare.fetch_records`; nothing here talks to
MLflow, so the table can be tested from literal values.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from longhaul.analysis import tags as T
from longhaul.analysis.selection import TEST_SUBSETS, select_checkpoint

#: Subsets in the order the original reported them; others follow alphabetically.
SUBSET_ORDER = ("train", "test", "covered_seen", "uncovered_seen", "unseen")
#: Pseudo-subset: the seed project's generalisation pass^1 (uncovered_seen·24 + unseen·10)/34.
GENERALISATION = "generalisation"
GENERALISATION_KEY = "eval/generalisation_pass_hat_1"
_NOT_SUBSETS = frozenset({"ci", "pass_hat_k", "pass_at_k"})
_SUBSET_KEY = re.compile(r"^eval/([^/]+)/pass_hat_k/1$")
_K_KEY = re.compile(r"^eval/(pass_hat_k|pass_at_k)/(\d+)$")


@dataclass(frozen=True)
class EvalPoint:
    """One evaluated checkpoint: its step, flat `eval/…` metrics and the evaluation run id."""

    step: int
    metrics: Mapping[str, float]
    run_id: str = ""


@dataclass(frozen=True)
class RunRecord:
    """A training run and its evaluated checkpoints."""

    experiment: str
    run_id: str
    run_name: str
    tags: Mapping[str, str]
    points: tuple[EvalPoint, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return self.tags.get(T.SPEC_NAME) or self.run_name

    @property
    def method(self) -> str:
        adv = self.tags.get(T.ADVANTAGE, "?")
        proc = self.tags.get(T.PROCESS_REWARD, "none")
        return adv if proc in ("none", "") else f"{adv} + {proc}"


@dataclass(frozen=True)
class Column:
    key: str  # CSV header
    title: str  # markdown header
    metric: str | None = None  # flat metric key, None for descriptive columns


def pass1_key(subset: str | None = None) -> str:
    """Flat metric key of pass^1 overall (None/'overall'), for a subset, or the generalisation pass^1."""
    if subset in (None, "overall"):
        return "eval/pass_hat_k/1"
    if subset == GENERALISATION:
        return GENERALISATION_KEY
    return f"eval/{subset}/pass_hat_k/1"


def discover_subsets(records: Sequence[RunRecord]) -> list[str]:
    """Subset names that have a pass^1 somewhere, in report order; 'generalisation' last when logged."""
    keys = {k for r in records for p in r.points for k in p.metrics}
    found = {m.group(1) for k in keys if (m := _SUBSET_KEY.match(k)) and m.group(1) not in _NOT_SUBSETS}
    known = [s for s in SUBSET_ORDER if s in found]
    return known + sorted(found - set(known)) + ([GENERALISATION] if GENERALISATION_KEY in keys else [])


def discover_ks(records: Sequence[RunRecord]) -> dict[str, list[int]]:
    """`{"pass_hat_k": [1, 2, 4], "pass_at_k": [...]}` present in the overall metrics."""
    ks: dict[str, set[int]] = {"pass_hat_k": set(), "pass_at_k": set()}
    for r in records:
        for p in r.points:
            for k in p.metrics:
                if m := _K_KEY.match(k):
                    ks[m.group(1)].add(int(m.group(2)))
    return {m: sorted(v) for m, v in ks.items()}


def build_columns(records: Sequence[RunRecord]) -> list[Column]:
    """Table columns for these records: identity, pass^1 overall/per subset, pass^k, pass@k, error rates."""
    cols = [
        Column("experiment", "experiment"),
        Column("run", "run"),
        Column("method", "method"),
        Column("step", "step"),
        Column("pass_hat_1", "pass^1", "eval/pass_hat_k/1"),
        Column("pass_hat_1_ci_lo", "CI lo", "eval/ci/pass_hat_k/1/lo"),
        Column("pass_hat_1_ci_hi", "CI hi", "eval/ci/pass_hat_k/1/hi"),
    ]
    cols += [Column(f"{s}_pass_hat_1", f"{s} pass^1", pass1_key(s)) for s in discover_subsets(records)]
    ks = discover_ks(records)
    cols += [Column(f"pass_hat_{k}", f"pass^{k}", f"eval/pass_hat_k/{k}") for k in ks["pass_hat_k"] if k != 1]
    cols += [Column(f"pass_at_{k}", f"pass@{k}", f"eval/pass_at_k/{k}") for k in ks["pass_at_k"] if k != 1]
    cols += [
        Column("tool_error_rate", "tool err", "eval/tool_error_rate"),
        Column("abort_rate", "abort", "eval/abort_rate"),
        Column("selected", "selected"),
    ]
    present = {k for r in records for p in r.points for k in p.metrics}
    return [c for c in cols if c.metric is None or c.metric in present]


def select_point(record: RunRecord) -> EvalPoint | None:
    """The checkpoint chosen on the run's `select_on` subset (tag; the spec default 'train' when absent) by
    `longhaul.analysis.selection.select_checkpoint`: highest pass^1, ties → earlier step. None when no point has
    that subset's pass^1 or the subset is a test subset: never the overall pass^1, which includes test tasks."""
    select_on = record.tags.get(T.SELECT_ON) or "train"
    if not record.points or select_on in TEST_SUBSETS:
        return None
    key = pass1_key(select_on)
    by_step = {p.step: p for p in record.points}
    chosen = select_checkpoint({step: p.metrics.get(key) for step, p in by_step.items()}, select_on)
    return None if chosen is None else by_step[chosen.step]


def build_rows(records: Sequence[RunRecord]) -> tuple[list[Column], list[dict[str, object]]]:
    """Columns and one row per (training run, evaluated checkpoint), runs by label, steps ascending."""
    cols = build_columns(records)
    rows: list[dict[str, object]] = []
    for r in sorted(records, key=lambda r: (r.label, r.run_name)):
        chosen = select_point(r)
        for p in sorted(r.points, key=lambda p: p.step):
            row: dict[str, object] = {
                "experiment": r.experiment,
                "run": r.run_name,
                "method": r.method,
                "step": p.step,
                "selected": "yes" if chosen is not None and p.step == chosen.step else "",
            }
            for c in cols:
                if c.metric is not None:
                    row[c.key] = p.metrics.get(c.metric)
            rows.append(row)
    return cols, rows


def _fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def render_markdown(cols: Sequence[Column], rows: Sequence[Mapping[str, object]]) -> str:
    """A GitHub-flavoured markdown table (3 decimals, — for missing values)."""
    lines = [
        "| " + " | ".join(c.title for c in cols) + " |",
        "|" + "|".join("---:" if c.metric or c.key == "step" else "---" for c in cols) + "|",
    ]
    lines += ["| " + " | ".join(_fmt(row.get(c.key)) for c in cols) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def build_comparison_note(
    run_names: Sequence[str],
    table: str,
    statistics: str = "",
    *,
    limit: int = T.TAG_VALUE_MAX,
    files: Sequence[str] = (),
) -> str:
    """The comparison run's description (markdown, at most `limit` characters): which runs, the ablation table
    and, when it fits, the statistics; a table too long keeps its header and the first rows that fit and says
    how many were left out. `files` names the artefacts that hold everything."""
    head = f"**Ablation** over {len(run_names)} training run(s): {', '.join(f'`{n}`' for n in run_names)}\n\n"
    tail = f"\n_Full results in the artefacts: {', '.join(f'`{f}`' for f in files)}._\n" if files else ""
    if len(head) > limit // 2:  # very many runs: name them in the artefacts, keep the room for the table
        head = f"**Ablation** over {len(run_names)} training runs\n\n"
    body = table.rstrip("\n") + "\n"
    room = limit - len(head) - len(tail)
    if len(body) > room:
        lines = body.splitlines()

        def cut(kept: list[str]) -> str:
            return "\n".join(kept) + f"\n\n_… {len(lines) - len(kept)} more row(s)._\n"

        kept = lines[:2]  # header and alignment rows
        for line in lines[2:]:
            if len(cut([*kept, line])) > room:
                break
            kept.append(line)
        body = cut(kept)
    elif statistics.strip() and len(body) + len(extra := "\n" + statistics.strip("\n") + "\n") <= room:
        body += extra
    return (head + body + tail)[:limit]


def render_csv(cols: Sequence[Column], rows: Sequence[Mapping[str, object]]) -> str:
    """CSV with machine-friendly headers and full-precision values (empty for missing)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.key for c in cols])
    for row in rows:
        w.writerow(["" if row.get(c.key) is None else row.get(c.key) for c in cols])
    return buf.getvalue()
