"""The pure half of benchmarks/bench_async.py: the benchmark's specs, each trainer mode's figures from veRL's step
metrics, the throughput ratios against sync, the target's rule and the printed table. No I/O."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline_runs import ROOT

SYNC = "sync"
#: The issue's target: an async mode trains this many times the trajectories per minute of sync.
TARGET_RATIO = 1.5
#: veRL's step metrics read from the run's MLflow store (the console's `gen s`, `step s`, `stale`, `spans`).
STEP_S, GEN_S = "timing_s/step", "timing_s/gen"
STALE = "training/off_policy/trajectory_staleness_worst/max"
SPANS = "training/off_policy/trajectory_spans/max"
STEP_KEYS = [STEP_S, GEN_S, STALE, SPANS]


# ------------------------------------------------------------------------------------------------------------
# Specs (pure)


def _copy(doc: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(doc))


def shrink(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`--small`: the smallest spec that still trains and evaluates (2 tasks × 2 samples per step, 3 turns, one
    evaluation sample per task at k = 1); the spec's tasks are kept."""
    out = _copy(doc)
    s = out["spec"]
    s["algorithm"].update(train_batch_size=2, group_size=2, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=2)
    s["environment"]["max_turns"] = 3
    s["evaluation"].update(samples_per_task=1, k=[1])
    return out


def run_spec(
    doc: Mapping[str, Any], mode: str, seed: int, steps: int, warmup_batches: float, simulator_url: str
) -> dict[str, Any]:
    """The spec of one benchmark run: training seed, steps (checkpoint at the last only), step 0 and the last
    step evaluated, the trainer mode, and the user simulator external at `simulator_url` (the latency proxy)."""
    out = _copy(doc)
    s = out["spec"]
    s["algorithm"].update(seed=seed, total_steps=steps, save_freq=steps)
    trainer: dict[str, Any] = {"mode": mode}
    if mode != SYNC:
        trainer["warmup_batches"] = warmup_batches
    if mode == "separate_async":  # rollout replicas on GPUs of their own (the spec refuses it without)
        trainer["rollout_gpus_per_node"] = 1
    s["algorithm"]["trainer"] = trainer
    s["evaluation"]["checkpoints"] = [0, steps]
    sim = s["user_simulator"]
    sim.pop("port", None)
    sim.update(placement="external", url=simulator_url)
    return out


def simulator_spec(doc: Mapping[str, Any], port: int, root: Path = ROOT) -> dict[str, Any]:
    """The spec whose launch plan holds the simulator server the benchmark starts: the spec's own simulator,
    colocated (so `render_plan` renders its server) on `port`, its model path made absolute under `root`."""
    out = _copy(doc)
    sim = out["spec"]["user_simulator"]
    sim.pop("url", None)
    sim.update(placement="colocated", port=port)
    if sim.get("model", {}).get("path"):
        sim["model"]["path"] = str((root / sim["model"]["path"]).resolve())
    return out


# ------------------------------------------------------------------------------------------------------------
# Aggregation and the table (pure)


def mode_figures(
    step_rows: Sequence[Mapping[str, float]],
    trajectories_per_step: int,
    stage_walls: Sequence[float],
    conversation_waits: Sequence[float],
) -> dict[str, Any]:
    """One mode's figures from veRL's per-step metrics of all its runs (`step_rows`, one dict per trained step),
    the trajectories each step trains, the grpo stages' wall clocks and the slowest trajectory of each step
    (seconds; empty: veRL's `timing_s/gen` stands in for it)."""
    rows = [r for r in step_rows if STEP_S in r]
    step_s = sum(r[STEP_S] for r in rows)
    gen_s = sum(r.get(GEN_S, 0.0) for r in rows)
    trajectories = len(rows) * trajectories_per_step
    stale = [r[STALE] for r in rows if STALE in r]
    spans = [r[SPANS] for r in rows if SPANS in r]
    wall = sum(stage_walls) if stage_walls else None
    gens = [r[GEN_S] for r in rows if GEN_S in r]
    waits, source = (list(conversation_waits), "trajectory wall time (rollout traces)")
    if not waits:
        waits, source = gens, "veRL timing_s/gen (no trajectory timings in the traces)"
    return {
        "steps": len(rows),
        "trajectories": trajectories,
        "step_s": step_s,
        "gen_s": gen_s,
        "traj_per_min_step": trajectories / (step_s / 60) if step_s > 0 else None,
        "traj_per_min_wall": trajectories / (wall / 60) if wall else None,
        "stage_wall_s": wall,
        "rollout_share": gen_s / step_s if step_s > 0 else None,
        "longest_conversation_s": max(waits) if waits else None,
        "longest_conversation_source": source,
        "stale_max": max(stale) if stale else None,
        "stale_mean": sum(stale) / len(stale) if stale else None,
        "spans_max": max(spans) if spans else None,
    }


def throughput_ratios(figures: Mapping[str, Mapping[str, Any]], base: str = SYNC) -> dict[str, dict[str, Any]]:
    """Each mode's trajectories per minute as a multiple of `base`'s (by veRL step time and by stage wall)."""
    ref = figures.get(base) or {}
    out: dict[str, dict[str, Any]] = {}
    for mode, f in figures.items():
        out[mode] = {
            key: (f[key] / ref[key]) if f.get(key) and ref.get(key) else None
            for key in ("traj_per_min_step", "traj_per_min_wall")
        }
    return out


def target_met(ratio: float | None, ci: Sequence[float] | None) -> bool:
    """The issue's target for one async mode: ≥ `TARGET_RATIO`× sync's trajectories per minute, and pass^1 not
    worse than sync's beyond the paired CI (the CI's upper end reaches 0)."""
    return ratio is not None and ratio >= TARGET_RATIO and ci is not None and ci[1] >= 0


def fmt(x: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def paired_cell(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "-"
    lo, hi = p["ci"]
    return f"{p['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] p={p['p']:.2f}"


def table_rows(
    figures: Mapping[str, Mapping[str, Any]],
    ratios: Mapping[str, Mapping[str, Any]],
    paired: Mapping[str, Mapping[str, Any]],
) -> list[tuple[str, list[str]]]:
    """(label, one cell per mode) of the benchmark's table."""
    modes = list(figures)

    def row(label: str, cell: Callable[[str, Mapping[str, Any]], str]) -> tuple[str, list[str]]:
        return label, [cell(m, figures[m]) for m in modes]

    return [
        row("runs ok / seeds", lambda m, f: f"{f.get('runs_ok', 0)}/{f.get('runs', 0)}"),
        row("steps trained", lambda m, f: str(f.get("steps", 0))),
        row("trajectories trained", lambda m, f: str(f.get("trajectories", 0))),
        row("veRL step time, sum (s)", lambda m, f: fmt(f.get("step_s"), ".1f")),
        row("trajectories/min (veRL step time)", lambda m, f: fmt(f.get("traj_per_min_step"))),
        row("  × sync", lambda m, f: fmt(ratios.get(m, {}).get("traj_per_min_step"), ".2f", "×")),
        row("grpo stage wall (s)", lambda m, f: fmt(f.get("stage_wall_s"), ".0f")),
        row("trajectories/min (grpo stage wall)", lambda m, f: fmt(f.get("traj_per_min_wall"))),
        row("  × sync", lambda m, f: fmt(ratios.get(m, {}).get("traj_per_min_wall"), ".2f", "×")),
        row("rollout share (gen s / step s)", lambda m, f: fmt(f.get("rollout_share"), ".1%")),
        row("longest conversation (s)", lambda m, f: fmt(f.get("longest_conversation_s"), ".1f")),
        row(
            "staleness worst: max / mean",
            lambda m, f: f"{fmt(f.get('stale_max'), '.0f')} / {fmt(f.get('stale_mean'), '.2f')}",
        ),
        row("trajectory spans: max", lambda m, f: fmt(f.get("spans_max"), ".0f")),
        row("train pass^1 step 0", lambda m, f: fmt(f.get("pass1_first"), ".3f")),
        row("train pass^1 last step", lambda m, f: fmt(f.get("pass1_last"), ".3f")),
        row("last pass^1 − sync [95% CI]", lambda m, f: "(base)" if m == SYNC else paired_cell(paired.get(m))),
        row("run wall, sum (min)", lambda m, f: fmt(f.get("run_wall_s", 0) / 60, ".1f")),
    ]


def format_table(modes: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Rows of `table_rows` as fixed-width text, the modes as columns."""
    first = max(len(label) for label, _ in rows)
    widths = [max(len(m), *(len(cells[i]) for _, cells in rows)) for i, m in enumerate(modes)]

    def line(label: str, cells: Sequence[str]) -> str:
        return "  ".join([label.ljust(first), *(c.rjust(w) for c, w in zip(cells, widths, strict=True))])

    out = [line("", list(modes)), "-" * (first + sum(w + 2 for w in widths))]
    out += [line(label, list(cells)) for label, cells in rows]
    return "\n".join(out)
