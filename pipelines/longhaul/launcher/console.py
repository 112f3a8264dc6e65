"""What the launcher shows on the console while a stage runs (pure): one compact line per veRL training step.

Server and trainer output (vLLM, Ray, veRL: thousands of lines per step on a loaded machine) goes to
`<run_dir>/logs/<name>.log` only; the console gets the launcher's own progress lines, and for the grpo stage
one line per step parsed from veRL's console logger (`step:N - key:value - key:value ...`). A failure prints
the tail of the failing log (the launcher's StageFailed message).
"""

from __future__ import annotations

import re

_STEP = re.compile(r"\bstep:(\d+) - (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = re.compile(r"^(?:np\.(?:float|u?int)\d+\()?(-?[\d.]+(?:e[-+]?\d+)?)\)?$")

#: (metric key in veRL's console line, label, format) of the per-step console line, in order.
STEP_COLUMNS = (
    ("critic/score/mean", "score", "{:+.4f}"),
    ("critic/advantages/min", "adv min", "{:+.4f}"),
    ("critic/advantages/max", "adv max", "{:+.4f}"),
    ("actor/pg_loss", "pg_loss", "{:+.5f}"),
    ("actor/grad_norm", "grad_norm", "{:.5f}"),
    ("actor/ppo_kl", "ppo_kl", "{:.2e}"),
    ("response_length/mean", "resp len", "{:.0f}"),
    ("timing_s/gen", "gen s", "{:.1f}"),
    ("timing_s/step", "step s", "{:.1f}"),
    # Policy versions behind the weights being trained, of the step's oldest trajectory (0 in sync: on-policy),
    # and the most versions one trajectory spans (2+: a generation resumed after an async trainer's update).
    ("training/off_policy/trajectory_staleness_worst/max", "stale", "{:.0f}"),
    ("training/off_policy/trajectory_spans/max", "spans", "{:.0f}"),
)


def parse_verl_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, numeric metrics) from one line of veRL's console logger, or None for any other line."""
    m = _STEP.search(_ANSI.sub("", line))
    if not m:
        return None
    metrics: dict[str, float] = {}
    for item in m.group(2).split(" - "):
        key, sep, value = item.partition(":")
        num = _NUMBER.match(value.strip()) if sep else None
        if num:
            metrics[key.strip()] = float(num.group(1))
    return int(m.group(1)), metrics


def format_step(step: int, total: int, metrics: dict[str, float]) -> str:
    """The console line of one training step (the columns of `STEP_COLUMNS` that veRL reported)."""
    parts = [f"{label} {fmt.format(metrics[key])}" for key, label, fmt in STEP_COLUMNS if key in metrics]
    return f"step {step}/{total}: " + "  ".join(parts)


def grpo_console(total_steps: int):
    """A line filter for the grpo stage: veRL's per-step metric lines become one compact line; the rest is
    only logged."""

    def show(line: str) -> str | None:
        parsed = parse_verl_step_line(line)
        return None if parsed is None else format_step(parsed[0], total_steps, parsed[1])

    return show


def quiet(_: str) -> None:
    """A line filter that shows nothing (servers: their logs are in the run directory)."""
    return None
