"""The two ablation figures (matplotlib, Agg): comparison at the selected checkpoint, progression over steps."""

from __future__ import annotations

from collections.abc import Sequence

# `Figure` without pyplot renders with the Agg canvas: no display, no global backend switch.
from matplotlib.figure import Figure

from longhaul.analysis.ablation import RunRecord, discover_ks, discover_subsets, pass1_key, select_point


def _ci(metrics: dict, prefix: str, value: float | None) -> tuple[float, float]:
    lo, hi = metrics.get(f"{prefix}/lo"), metrics.get(f"{prefix}/hi")
    if value is None or lo is None or hi is None:
        return 0.0, 0.0
    return max(value - lo, 0.0), max(hi - value, 0.0)


def build_comparison_figure(records: Sequence[RunRecord]) -> Figure:
    """Left: pass^1 overall and per subset at each run's selected checkpoint (CI bars when logged).
    Right: pass^k and pass@k over k (overall) at the same checkpoint."""
    runs = [(r, p) for r in sorted(records, key=lambda r: r.label) if (p := select_point(r)) is not None]
    subsets = ["overall", *discover_subsets(records)]
    ks = discover_ks(records)
    fig = Figure(figsize=(13, 5.2), dpi=110, layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[3, 2])
    width = 0.8 / max(len(runs), 1)
    for i, (r, p) in enumerate(runs):
        xs, ys, err_lo, err_hi = [], [], [], []
        for j, s in enumerate(subsets):
            v = p.metrics.get(pass1_key(s))
            if v is None:
                continue
            base = "eval" if s == "overall" else f"eval/{s}"
            lo, hi = _ci(dict(p.metrics), f"{base}/ci/pass_hat_k/1", v)
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(v)
            err_lo.append(lo)
            err_hi.append(hi)
        bars = ax.bar(xs, ys, width * 0.95, yerr=[err_lo, err_hi], capsize=3, label=f"{r.label} (step {p.step})")
        ax.bar_label(bars, fmt="%.2f", fontsize=7, label_type="center", color="white")
        for measure, style in (("pass_hat_k", "-o"), ("pass_at_k", "--s")):
            pts = [(k, p.metrics[f"eval/{measure}/{k}"]) for k in ks[measure] if f"eval/{measure}/{k}" in p.metrics]
            if pts:
                color = bars.patches[0].get_facecolor() if bars.patches else None
                ax2.plot(
                    [k for k, _ in pts],
                    [v for _, v in pts],
                    style,
                    color=color,
                    label=f"{r.label} {'pass^k' if measure == 'pass_hat_k' else 'pass@k'}",
                )
    ax.set_xticks(range(len(subsets)), [s.replace("_", "\n") for s in subsets])
    ax.set_ylabel("pass^1 (bars: CI when logged)")
    ax.set_ylim(0, 1.12)
    ax.set_title("pass^1 by subset at the selected checkpoint")
    ax.grid(axis="y", alpha=0.3)
    if runs:
        ax.legend(fontsize=8, loc="upper left", ncols=min(len(runs), 3))
    all_ks = sorted(set(ks["pass_hat_k"]) | set(ks["pass_at_k"]))
    if all_ks:
        ax2.set_xticks(all_ks)
    ax2.set_xlabel("k")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("pass^k (solid) and pass@k (dashed), all tasks")
    ax2.grid(alpha=0.3)
    if runs:
        ax2.legend(fontsize=7, loc="best")
    fig.suptitle("longhaul ablation: comparison")
    return fig


def build_progression_figure(records: Sequence[RunRecord]) -> Figure:
    """pass^1 over checkpoint steps, one panel per subset (overall first), one line per run."""
    panels = ["overall", *discover_subsets(records)]
    ncols = min(3, len(panels))
    nrows = (len(panels) + ncols - 1) // ncols
    fig = Figure(figsize=(4.6 * ncols, 3.6 * nrows), dpi=110, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    steps = sorted({p.step for r in records for p in r.points})
    for ax, s in zip(axes, panels, strict=False):
        key = pass1_key(s)
        for r in sorted(records, key=lambda r: r.label):
            pts = sorted((p.step, p.metrics[key]) for p in r.points if key in p.metrics)
            if not pts:
                continue
            (line,) = ax.plot([x for x, _ in pts], [y for _, y in pts], "-o", label=r.label)
            chosen = select_point(r)
            if chosen is not None and key in chosen.metrics:
                ax.plot([chosen.step], [chosen.metrics[key]], "*", ms=13, color=line.get_color())
        ax.set_title(f"{s.replace('_', ' ')} pass^1")
        ax.set_xlabel("checkpoint step")
        if 0 < len(steps) <= 12:
            ax.set_xticks(steps)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if records:
        axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("longhaul ablation: pass^1 over training (★ = selected checkpoint)")
    return fig
