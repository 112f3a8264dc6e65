"""The end-of-run summary the launcher prints: veRL's per-step metrics, the learning curve with pass^1 per
evaluated checkpoint beside the do-nothing agent's floor, the machine it ran on, and how to open MLflow."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from longhaul.eval.curve import (
    TRAIN_EPISODES,
    build_learning_curve,
    format_subset,
    format_terminations,
    subset_floors,
    training_metric_keys,
)
from longhaul.launcher.console import STEP_COLUMNS
from longhaul.launcher.context import StageContext
from longhaul.machine import machine_line
from longhaul.tracking.config import build_ui_hint


def print_summary(ctx: StageContext, echo: TextIO) -> None:
    """The end-of-run tables: veRL's own per-step metrics (score, advantages, policy loss, gradient norm, the
    KL between the policy before and after each optimizer step), then the learning curve (`longhaul.eval.curve`:
    per step the training episodes' mean reward and outcome and how they ended; per evaluated checkpoint pass^1
    with c/n per subset beside the do-nothing agent's floor and how the evaluated episodes ended), then how to
    open MLflow."""

    # deferred: mlflow via tracking.runs (~1 s)
    from longhaul.tracking.runs import fetch_step_metrics

    console = Console(file=echo, width=160, force_terminal=False)
    curve_keys = training_metric_keys()
    try:
        metrics = fetch_step_metrics(ctx.tracking_uri, ctx.run_id, [key for key, _, _ in STEP_COLUMNS] + curve_keys)
    except Exception as exc:  # noqa: BLE001 - the summary must not hide the run's status
        metrics = {}
        console.print(f"(training metrics unavailable: {exc})")
    train = {step: row for step, row in metrics.items() if any(key in row for key, _, _ in STEP_COLUMNS)}
    if train:
        t = Table(title=f"training ({ctx.plan.run_name}; veRL metrics)")
        t.add_column("step", justify="right")
        for _, label, _ in STEP_COLUMNS:
            t.add_column(label, justify="right")
        for step, row in train.items():
            t.add_row(str(step), *[fmt.format(row[key]) if key in row else "-" for key, _, fmt in STEP_COLUMNS])
        console.print(t)
    curve = learning_curve_table(ctx, metrics)
    if curve is not None:
        console.print(curve)

        console.print(f"machine: {machine_line()}")  # a tiny model's curve depends on the CPU's arithmetic
    console.print(f"status: {ctx.results.status}; run directory: {ctx.run_dir}")

    console.print(
        f"MLflow UI: {build_ui_hint(ctx.tracking_uri, ctx.experiment_id)}   (run id {ctx.run_id})", soft_wrap=True
    )


def learning_curve_table(ctx: StageContext, metrics: dict[int, dict[str, float]]) -> Any:
    """The learning curve as a rich Table (None when nothing was trained or evaluated)."""
    select_on = str(ctx.exp.spec.evaluation.select_on)
    subsets = list(dict.fromkeys(("train", "test", select_on)))
    trained = {step: row for step, row in metrics.items() if TRAIN_EPISODES in row}  # steps with rollout traces
    points = build_learning_curve(trained, ctx.results.eval_summaries, subsets)
    if not points:
        return None
    floors = subset_floors(points)
    shown = [name for name in subsets if name in floors]
    selected = (ctx.results.selection or {}).get("step")
    floor_text = ", ".join(f"{n} {f:.3f}" for n, f in floors.items() if f is not None)
    t = Table(
        title="learning curve (step 0 = initial policy; reward, outcome: training episodes; pass^1: evaluation)",
        caption=f"do-nothing agent's pass^1 (the floor): {floor_text}" if floor_text else None,
    )
    for col in ("step", "reward", "outcome", "training episodes ended"):
        t.add_column(col, justify="right")
    for name in shown:
        t.add_column(f"{name}: pass^1 (c/n)", justify="right")
    t.add_column("evaluated episodes ended", justify="right")
    t.add_column("selected", justify="right")
    for p in points:
        t.add_row(
            str(p.step),
            "-" if p.reward is None else f"{p.reward:+.3f}",
            "-" if p.outcome is None else f"{p.outcome:.3f}",
            format_terminations(p.train_terminations) or "-",
            *[format_subset(p.subsets.get(name)) for name in shown],
            format_terminations(p.eval_terminations) or "-",
            "yes" if selected == p.step else "",
        )
    return t
