"""The launcher's one console line per training step, parsed from veRL's console logger."""

from __future__ import annotations

from longhaul.launcher.console import STEP_COLUMNS, format_step, grpo_console, parse_verl_step_line

#: A line of veRL 0.9.1's console logger as the v1 trainer prints it (numpy scalars, ANSI colour, Ray prefix).
LINE = (
    "\x1b[36m(TaskRunnerV1 pid=5226)\x1b[0m step:2 - critic/score/mean:np.float64(0.2434) - "
    "critic/advantages/min:-12.1459 - critic/advantages/max:11.726 - actor/pg_loss:0.65873 - "
    "actor/grad_norm:7.83677 - actor/ppo_kl:-0.000308 - response_length/mean:426.0 - timing_s/gen:10.02 - "
    "timing_s/step:43.08 - training/off_policy/trajectory_staleness_worst/max:np.int64(1) - "
    "training/off_policy/trajectory_spans/max:2 - actor/lr:0.0001 - note:text"
)


def test_a_verl_step_line_becomes_one_compact_line_with_staleness() -> None:
    step, metrics = parse_verl_step_line(LINE)
    assert step == 2 and metrics["actor/lr"] == 0.0001 and "note" not in metrics
    assert metrics["training/off_policy/trajectory_staleness_worst/max"] == 1.0
    line = format_step(step, 6, metrics)
    assert line.startswith("step 2/6: score +0.2434  adv min -12.1459")
    assert line.endswith("gen s 10.0  step s 43.1  stale 1  spans 2")


def test_columns_veRL_did_not_report_are_left_out_and_other_lines_are_not_shown() -> None:
    show = grpo_console(3)
    assert show("step:1 - critic/score/mean:0.5 - timing_s/step:20.0") == "step 1/3: score +0.5000  step s 20.0"
    assert show("INFO: all initialize finished, ready to fit") is None
    assert len({label for _, label, _ in STEP_COLUMNS}) == len(STEP_COLUMNS)
