"""The stages as the launcher runs them: the registry that names them, and the one way a stage's command runs
(`run_command`).

Every stage of a plan (`longhaul.render.plan.render_stages`) is looked up by name in `STAGES`: `sft` runs its
command, `grpo` prepares veRL's inputs and the resume point, runs its command and records the checkpoints, `eval`
runs inside the launcher (it needs the policy server's handle and the stop control; its plan has no command). A
command runs as a `ManagedProcess`: its own process group, the output prefixed and copied to
`<run_dir>/logs/<name>.log`, SIGTERM to the group on a stop or checkpoint request, stopped when a server it
depends on exits. `longhaul sft run` runs each of its steps the same way.

A stage gets a `StageContext` and hands back what the end-of-run summary shows in its `StageResults`
(`longhaul.launcher.context`, below this registry and the stage modules it calls).
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from longhaul.agentloop.dataset import write_verl_inputs
from longhaul.checkpoints import prepare_resume, saved_steps, step_dir
from longhaul.launcher.console import grpo_console
from longhaul.launcher.context import StageContext
from longhaul.launcher.control import RequeueRequested, StopControl, StopRequested, handle_signals
from longhaul.launcher.processes import ManagedProcess, describe_exit
from longhaul.launcher.traces import log_training_episodes
from longhaul.layout import LOGS_SUBDIR
from longhaul.protocol import EXIT_FAILED, EXIT_OK, EXIT_REQUEUE
from longhaul.render.plan import StagePlan
from longhaul.render.verl import ENV_RAY_ADDRESS, ray_job_env_overrides
from longhaul.spec.models import Stage
from longhaul.tracking.config import require_trainer_env

if TYPE_CHECKING:
    from longhaul.launcher.servers import ManagedServer
    from longhaul.layout import Paths
    from longhaul.spec.models import Experiment


class StageFailed(RuntimeError):
    """A stage exited non-zero or raised; the message names it and carries the tail of its log."""

    def __init__(self, message: str, *, no_space: bool = False, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.no_space = no_space
        self.exit_code = exit_code


class ServerCrashed(RuntimeError):
    """A server the launcher started exited during a stage; `servers` are the ones that did."""

    def __init__(self, message: str, servers: list[ManagedServer]) -> None:
        super().__init__(message)
        self.servers = servers


def stage_command(argv: tuple[str, ...]) -> list[str]:
    """A stage's argv as run here: the plan's `python` / `longhaul` are the launcher's own interpreter and CLI,
    so a stage runs in the same environment as the launcher whatever PATH says (a virtualenv not on PATH)."""
    if argv and argv[0] == "python":
        return [sys.executable, *argv[1:]]
    if argv and argv[0] == "longhaul":
        return [sys.executable, "-m", "longhaul.cli", *argv[1:]]
    return list(argv)


def _crashed(servers: list[ManagedServer]) -> list[ManagedServer]:
    return [s for s in servers if s.crashed]


def run_command(
    stage: StagePlan,
    env: dict[str, str],
    run_dir: Path,
    control: StopControl,
    echo: TextIO,
    console: Any = None,
    servers: list[ManagedServer] | None = None,
    startup_failure: Callable[[], BaseException | None] | None = None,
) -> None:
    """Run a stage's command as a child process; stop it (SIGTERM to its group) on a stop or checkpoint request,
    as soon as one of `servers` exits (ServerCrashed: the stage would only fail its requests until it gave up), or
    when `startup_failure` reports a server that failed to start beside it (that error is raised).
    Raises StopRequested / RequeueRequested after a request, StageFailed on a non-zero exit."""
    log = run_dir / LOGS_SUBDIR / f"{stage.name}.log"
    proc = ManagedProcess(
        stage.name, stage_command(stage.argv), {**env, **stage.env}, log_path=log, echo=echo, console=console
    ).start()
    forwarded_ckpt = forwarded_stop = False
    crashed: list[ManagedServer] = []
    failure: BaseException | None = None
    try:
        while proc.poll() is None:
            crashed = _crashed(servers or [])
            failure = startup_failure() if startup_failure is not None else None
            if crashed or failure is not None:
                break
            if control.checkpoint.is_set() and not forwarded_ckpt:
                forwarded_ckpt = True
                # veRL has no "save now" hook: it is stopped and its newest periodic checkpoint (save_freq)
                # is the resume point (trainer.resume_mode=auto).
                proc.send_signal(signal.SIGTERM)
            if control.stop.is_set() and not forwarded_stop:
                forwarded_stop = True
                proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        rc = proc.stop() if crashed or failure is not None else proc.wait()
    finally:
        proc.stop()
    if control.stop.is_set():
        raise StopRequested(control.signal_name or "stop")
    if failure is not None and not isinstance(failure, InterruptedError):
        raise failure
    if control.checkpoint.is_set() or rc == EXIT_REQUEUE:
        raise RequeueRequested(stage.name)
    crashed = crashed or (_crashed(servers or []) if rc != 0 else [])
    if crashed:
        raise ServerCrashed(
            f"{'; '.join(s.describe_crash(stage.name) for s in crashed)} (the stage was stopped)", crashed
        )
    if rc != 0:
        raise StageFailed(
            f"stage '{stage.name}' {describe_exit(rc)}: {' '.join(stage.argv[:4])} …\n"
            f"--- last lines of {log} ---\n{proc.tail()}",
            no_space=proc.no_space_seen,
            exit_code=rc,
        )


def run_steps(
    stage: str,
    steps: Sequence[tuple[str, tuple[str, ...]]],
    env: dict[str, str],
    run_dir: Path,
    echo: TextIO,
    say: Callable[[str], None],
) -> int:
    """Run a stage's steps (name, argv) in order, each as `run_command` runs a stage: own process group, log in
    `<run_dir>/logs/<stage>-<step>.log`, SIGTERM forwarded on a stop or checkpoint request (this process's own
    signals, `handle_signals`). Returns the exit code: 0; the failed step's (EXIT_FAILED when a signal ended
    it); EXIT_REQUEUE after a checkpoint request; the stop signal's after a stop."""
    control = StopControl()
    with handle_signals(control):
        for name, argv in steps:
            say(f"{name}: {' '.join(argv[:6])} … (log: {run_dir / 'logs' / f'{stage}-{name}.log'})")
            try:
                run_command(StagePlan(f"{stage}-{name}", argv), env, run_dir, control, echo)
            except StageFailed as exc:
                say(f"step {name} failed: {exc}")
                return exc.exit_code if exc.exit_code and exc.exit_code > 0 else EXIT_FAILED
            except StopRequested:
                say(f"step {name}: stopped by {control.signal_name}")
                return control.stop_exit_code
            except RequeueRequested:
                say(f"step {name}: stopped for a checkpoint request")
                return EXIT_REQUEUE
    return EXIT_OK


def run_command_stage(ctx: StageContext, stage: StagePlan, console: Any = None) -> None:
    """A stage that is its command (sft)."""
    ctx.say(f"stage {stage.name}: log in {Path(ctx.paths.logs_dir) / (stage.name + '.log')}")
    run_command(stage, ctx.env, ctx.run_dir, ctx.control, ctx.echo, console, ctx.servers, ctx.startup_failure)


def prepare_verl_inputs(exp: Experiment, paths: Paths, env: Mapping[str, str], say: Callable[[str], None]) -> None:
    """Before veRL starts: refuse a missing tracking target, write the task parquet and agent-loop/tool YAML."""
    require_trainer_env(env)
    written = write_verl_inputs(exp, paths)
    say(f"veRL inputs written: {', '.join(p.name for p in written)}")


def run_grpo_stage(ctx: StageContext, stage: StagePlan) -> None:
    """veRL's trainer: its inputs (`prepare_verl_inputs`), the resume point, the run, then its checkpoints, each
    step's outcome metrics and a sample of its episodes recorded on the MLflow run."""
    # deferred: mlflow via tracking.runs (~1 s)
    from longhaul.tracking.runs import log_checkpoint

    prepare_verl_inputs(ctx.exp, ctx.paths, ctx.env, ctx.say)
    # The tracker names the newest complete checkpoint; a save cut short is cleared.
    point = prepare_resume(ctx.checkpoint_dir)
    for change in point.changes:
        ctx.say(f"checkpoints: {change}")
    ctx.say(
        f"veRL resumes from step {point.step} ({ctx.checkpoint_dir})"
        if point.step is not None
        else f"no complete checkpoint in {ctx.checkpoint_dir}: veRL trains from step 0"
    )
    if ctx.env.get(ENV_RAY_ADDRESS):
        # veRL attaches to the job's Ray cluster (multi-node): its actors do not inherit the driver's environment.
        extra = ray_job_env_overrides({**ctx.env, **stage.env}, ctx.inherited_env)
        stage = replace(stage, argv=(*stage.argv, *extra))
        ctx.say(f"Ray cluster at {ctx.env[ENV_RAY_ADDRESS]}: {len(extra)} stage variables passed to veRL's Ray job")
    run_command_stage(ctx, stage, grpo_console(ctx.exp.spec.algorithm.total_steps))
    steps = saved_steps(ctx.checkpoint_dir)
    for step in steps:  # by URI, idempotent
        log_checkpoint(ctx.tracking_uri, ctx.run_id, step, step_dir(ctx.checkpoint_dir, step).resolve().as_uri())
    ctx.say(f"checkpoints saved by veRL: steps {steps or 'none'} in {ctx.checkpoint_dir}")
    log_training_episodes(ctx, ctx.paths.rollouts_dir, ctx.say)


def _eval_stage(ctx: StageContext, _stage: StagePlan) -> None:
    # deferred: the eval stage's env, driver and rich.progress (~0.1 s); `sft run` imports stages
    from longhaul.launcher.evaluate import run_eval_stage

    run_eval_stage(ctx)


StageRunner = Callable[[StageContext, StagePlan], None]

#: Every stage by name (`spec.stages`): how the launcher runs it.
STAGES: dict[str, StageRunner] = {
    Stage.SFT.value: run_command_stage,
    Stage.GRPO.value: run_grpo_stage,
    Stage.EVAL.value: _eval_stage,
}
#: The stages that run inside the launcher: their plan has no command.
IN_PROCESS = frozenset({Stage.EVAL.value})
#: The stages that start while the servers are still loading: veRL's start-up (Ray, the actor, the rollout engine:
#: minutes on GPUs) overlaps the simulator's, and its agent loop waits for the simulator to serve
#: (`longhaul.clients.ready`). Every other stage starts once the servers are healthy.
STARTS_BESIDE_SERVERS = frozenset({Stage.GRPO.value})
