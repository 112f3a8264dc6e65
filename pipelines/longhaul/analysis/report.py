"""`longhaul compare`'s report (pure): the ablation table as markdown and CSV, the statistics over seeds × tasks ×
samples and their markdown, and the name of the comparison run — what `longhaul.tracking.compare` writes to files
and logs to MLflow, less the figures (`longhaul.analysis.figures`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from longhaul.analysis.ablation import RunRecord, build_rows, discover_ks, render_csv, render_markdown
from longhaul.analysis.study import Arm, Statistics, build_statistics
from longhaul.analysis.study_render import render_statistics_markdown


@dataclass(frozen=True)
class ComparisonReport:
    """The ablation table (markdown, CSV) and the statistics (values, markdown) of one comparison."""

    table: str
    csv: str
    statistics: Statistics
    statistics_md: str

    @property
    def markdown(self) -> str:
        """What `longhaul compare` prints: the table, then the statistics section."""
        return self.table + self.statistics_md


def build_comparison_report(
    records: Sequence[RunRecord],
    arms: Sequence[Arm],
    floor: Mapping[str, float] | None = None,
    *,
    problems: Sequence[str] = (),
) -> ComparisonReport:
    """The table of every (training run, evaluated checkpoint) and the statistics of `arms` at the k values the
    runs logged (pass^1 when none), with the do-nothing agent's `floor` and the `problems` met reading them."""
    cols, rows = build_rows(records)
    statistics = build_statistics(arms, discover_ks(records)["pass_hat_k"] or [1], floor, problems=problems)
    return ComparisonReport(
        render_markdown(cols, rows), render_csv(cols, rows), statistics, render_statistics_markdown(statistics)
    )


def comparison_run_name(run_ids: Sequence[str]) -> str:
    """`compare-<8 hex of the sorted run ids>`: the same compared runs log to the same comparison run."""
    return f"compare-{hashlib.sha256(','.join(sorted(run_ids)).encode()).hexdigest()[:8]}"
