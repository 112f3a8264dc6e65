"""Stages by name (`longhaul.launcher.stages.STAGES`), their typed context and results, and `longhaul sft run`'s
steps under the same supervision as a stage: own process group, a log per step, stop signals forwarded."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from longhaul.launcher.context import StageContext, StageResults
from longhaul.launcher.control import StopControl
from longhaul.launcher.stages import IN_PROCESS, STAGES, run_steps
from longhaul.protocol import EXIT_KILLED, EXIT_OK
from longhaul.render.plan import render_plan
from longhaul.spec import parse_spec_text
from longhaul.spec.models import Stage

ROOT = Path(__file__).resolve().parents[3]


def _all_stages_spec():
    doc = yaml.safe_load((ROOT / "specs" / "lata.yaml").read_text())
    doc["spec"]["stages"] = ["sft", "grpo", "eval"]
    doc["spec"]["sft"] = {"epochs": 1, "batch_size": 8, "micro_batch_size_per_gpu": 2, "max_length": 12288}
    return parse_spec_text(yaml.safe_dump(doc))


def test_every_stage_of_a_plan_is_registered_by_name() -> None:
    """The registry names exactly the spec's stages; the plan gives a command to every stage that is not run
    inside the launcher, and none to those that are (nothing in the plan is a placeholder)."""
    assert set(STAGES) == {s.value for s in Stage} and IN_PROCESS <= set(STAGES)
    plan = render_plan(_all_stages_spec(), "slurm", "/runs/r")
    assert [s.name for s in plan.stages] == ["sft", "grpo", "eval"]
    for stage in plan.stages:
        assert stage.name in STAGES
        assert (stage.argv == ()) == (stage.name in IN_PROCESS), stage


def test_context_starts_the_policy_once_and_collects_typed_results(tmp_path: Path) -> None:
    started = []
    plan = SimpleNamespace(paths=SimpleNamespace(checkpoint_dir=str(tmp_path / "ckpt"), eval_dir="e"))
    ctx = StageContext(
        None,
        plan,
        tmp_path,
        "",
        "run",
        {},
        StopControl(),
        "",
        "",
        io.StringIO(),  # type: ignore[arg-type]
        start_policy=lambda: started.append(1) or "server",
    )
    assert ctx.policy_server() == ctx.policy_server() == "server" and started == [1]
    assert ctx.paths is plan.paths and ctx.checkpoint_dir == tmp_path / "ckpt"
    assert ctx.results == StageResults() and ctx.results.eval_summaries == {} and ctx.results.selection is None
    with pytest.raises(TypeError):
        StageContext(
            None,
            plan,
            tmp_path,
            "",
            "run",
            {},
            StopControl(),
            "",
            "",
            io.StringIO(),  # type: ignore[arg-type]
            _policy="x",
        )  # the cached server is the context's own


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_steps_run_in_order_with_a_log_each_and_stop_at_a_failure(tmp_path: Path) -> None:
    said: list[str] = []
    steps = [
        ("one", _py("print('first')")),
        ("two", _py("import sys; print('second'); sys.exit(3)")),
        ("three", _py("print('never')")),
    ]
    rc = run_steps("sft", steps, dict(os.environ), tmp_path, io.StringIO(), said.append)
    assert rc == 3
    assert "first" in (tmp_path / "logs" / "sft-one.log").read_text()
    assert "second" in (tmp_path / "logs" / "sft-two.log").read_text()
    assert not (tmp_path / "logs" / "sft-three.log").exists()
    assert any("step two failed" in m and "exit code 3" in m for m in said), said
    assert run_steps("sft", steps[:1], dict(os.environ), tmp_path, io.StringIO(), said.append) == EXIT_OK


def test_a_stop_signal_reaches_the_step_in_its_own_process_group(tmp_path: Path) -> None:
    """SIGTERM to the process running the steps (the launcher stopping `longhaul sft run`) is forwarded to the
    running step's process group; the step's group is its own, not this process's."""
    child = tmp_path / "step.py"
    child.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('stopping', flush=True), sys.exit(143)))\n"
        "print('pgid', os.getpgid(0), flush=True)\n"
        "time.sleep(60)\n"
    )
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        rc = run_steps(
            "sft",
            [("train", (sys.executable, str(child))), ("export", _py("print('never')"))],
            dict(os.environ),
            tmp_path,
            io.StringIO(),
            lambda _m: None,
        )
    finally:
        timer.cancel()
    assert rc == EXIT_KILLED
    log = (tmp_path / "logs" / "sft-train.log").read_text()
    assert "stopping" in log
    pgid = int(next(line for line in log.splitlines() if "pgid" in line).split()[-1])
    assert pgid != os.getpgid(0)
    assert not (tmp_path / "logs" / "sft-export.log").exists()


def test_longhaul_sft_run_runs_its_steps_supervised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from longhaul.cli import app
    from longhaul.sft.overrides import SFTStep

    steps = [
        SFTStep("collect", _py("print('collected')")),
        SFTStep("train", _py("import sys; sys.exit(4)")),
        SFTStep("export", _py("print('never')")),
    ]
    monkeypatch.setattr("longhaul.sft.overrides.render_sft_steps", lambda exp, paths: steps)
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["sft", "run", "--spec", str(ROOT / "specs" / "smoke.yaml"), "--run-dir", str(run_dir)]
    )
    assert res.exit_code == 4, res.output
    assert "collected" in (run_dir / "logs" / "sft-collect.log").read_text()
    assert (run_dir / "logs" / "sft-train.log").exists() and not (run_dir / "logs" / "sft-export.log").exists()


@pytest.mark.parametrize("command", ["run", "launch"])
def test_an_unknown_stage_is_refused_before_anything_is_written(command: str, tmp_path: Path) -> None:
    """`longhaul run --stage bogus` (and the launcher) refuse with one line naming the spec's stages, exit 2, and
    leave no run directory behind."""
    from longhaul.cli import app

    spec = tmp_path / "smoke.yaml"
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"].setdefault("backends", {})["local"] = {"output_dir": str(tmp_path / "runs")}
    spec.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "runs" / "x"
    args = ["--stage", "bogus", "--run-dir", str(run_dir)]
    argv = (
        ["run", str(spec), *args] if command == "run" else ["launch", "--spec", str(spec), "--backend", "local", *args]
    )
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert "--stage bogus: not in this spec's stages (grpo, eval)" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "runs").exists()
