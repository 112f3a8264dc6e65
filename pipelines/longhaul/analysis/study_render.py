"""The statistics section of `longhaul compare` as markdown (pure): what was measured, how it was tested, and the
verdicts (`statistics.md`, printed after the ablation table)."""

from __future__ import annotations

import math

from longhaul.analysis.study import Rate, Statistics
from longhaul.eval import stats


def _pct(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _rate_cell(r: Rate | None) -> str:
    return "—" if r is None else f"{r.value:.3f} [{r.lo:.3f}, {r.hi:.3f}]"


def _method(st: Statistics) -> list[str]:
    """How the comparisons were tested and corrected, in the words the verdicts use."""
    m = len(st.comparisons)
    family = f"{m} comparison{'s' if m != 1 else ''}: every pair of arms on every subset both ran"
    return [
        "",
        "### Paired comparisons (pass^1, B − A on the tasks both ran)",
        "",
        "Test: the difference over tasks and training seeds — a t-test whose variance has a task part and a "
        "whole-seed part (the seed part measured from the seeds, pooled over both arms; Welch–Satterthwaite degrees "
        "of freedom) — and the exact sign-flip test over tasks; p is the larger of the two and the 95% CI is the "
        "t-test's. One seed in an arm: the seed SD is assumed "
        f"({stats.DEFAULT_SEED_SD * 100:.1f} points unless the other arm measures it) and there is no verdict, "
        "because a single seed cannot tell a better method from a luckier training run. "
        f"Multiplicity: {stats.CORRECTION}'s correction over the family of {family}, at α = {st.alpha:g} "
        f"(p shown, then its {stats.CORRECTION}-adjusted value). MDE: the smallest improvement over A that this "
        f"rule calls at {stats.POWER:.0%} power with this design, tested at α/{m} (`longhaul power "
        "--from-comparison design.json` for the first comparison).",
        "",
    ]


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
        "95% CIs: hierarchical bootstrap (tasks, then seeds); an arm with one seed gets that run's CI, which its "
        "seed's luck is not part of. Flip rate: share of outcomes that differ between two seeds of the arm. "
        "Null floor: the do-nothing agent on the same tasks.",
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
        lines += _method(st)
        lines += [f"- {c.b} vs {c.a}, {c.subset}: {c.verdict}" for c in st.comparisons]
    if st.problems:
        lines += ["", "### Not compared or not reported", ""] + [f"- {p}" for p in st.problems]
    return "\n".join(lines) + "\n"
