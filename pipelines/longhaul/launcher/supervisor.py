"""`longhaul launch`: execute a launch plan (servers → stages → clean stop). Protocol: see the package docstring.

`_launch_locked` reads as the recipe; each step is a function below it. The stages themselves are in
launcher/stages.py, the end-of-run tables in launcher/summary.py.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from longhaul import constants as C
from longhaul.checkpoints import CheckpointError
from longhaul.files import atomic_write_json, atomic_write_text
from longhaul.launcher.context import StageContext
from longhaul.launcher.control import RequeueRequested, StopControl, StopRequested, handle_signals
from longhaul.launcher.diskspace import disk_full_hint, looks_like_no_space, newest_checkpoint
from longhaul.launcher.files import LockBusy, exclusive_lock
from longhaul.launcher.processes import kill_supervised
from longhaul.launcher.servers import ManagedServer, PolicyServer, ServerStartError, StartupWatch
from longhaul.launcher.stages import STAGES, STARTS_BESIDE_SERVERS, ServerCrashed, StageFailed
from longhaul.launcher.summary import print_summary
from longhaul.layout import DONE_SUFFIX, LAUNCHER_LOCK_FILE, PLAN_FILE, STAGES_DIR
from longhaul.protocol import EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE
from longhaul.redact import redact_uri
from longhaul.render.plan import LaunchPlan, StagePlan, render_plan, stage_refusal
from longhaul.spec import Experiment, SpecError, load_spec, resolved_yaml, run_name
from longhaul.tracking.config import ENV_TRACKING_URI, tracking_env

#: MLflow's switch for its "View run … at: <tracking URI>" line (set when the URI carries credentials).
ENV_MLFLOW_QUIET_URL = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
#: How many times one launch restarts a server that crashed during a stage (all servers together) and runs the
#: interrupted stage again (the veRL stage resumes from its newest complete checkpoint); one more crash fails
#: the run with a message that says how to resume.
MAX_SERVER_RESTARTS = 2


def build_server_env(exp: Experiment, plan: LaunchPlan) -> dict[str, str]:
    """Where every stage finds the servers (`longhaul eval` and `longhaul sft` read these variables)."""
    return {
        C.ENV_SIMULATOR_BASE_URL: plan.simulator_base_url,
        C.ENV_SIMULATOR_MODEL: exp.spec.user_simulator.model.name,
        C.ENV_POLICY_BASE_URL: plan.policy_server.base_url,
        C.ENV_POLICY_MODEL: plan.policy_server.served_model_name,
    }


def _server_python(exp: Experiment, environ: Mapping[str, str]) -> str:
    """The servers' interpreter: $LONGHAUL_VLLM_PYTHON, else the launcher's own (one environment holds longhaul,
    veRL and vLLM, on CPU as in the GPU image)."""
    return environ.get(C.ENV_VLLM_PYTHON) or sys.executable


def _done_marker(run_dir: Path, stage: str) -> Path:
    return run_dir / STAGES_DIR / f"{stage}{DONE_SUFFIX}"


def _mark_requeued(uri: str, run_id: str) -> None:
    from longhaul.tracking.runs import mark_requeued  # deferred: mlflow via tracking.runs (~1 s)

    mark_requeued(uri, run_id)


def launch(
    spec_path: str | Path,
    backend: str,
    run_dir: str | Path,
    *,
    stage: str | None = None,
    environ: Mapping[str, str] | None = None,
    echo: TextIO | None = None,
) -> int:
    """Run the plan of `spec_path` on `backend` with outputs in `run_dir`; returns the process exit code."""
    environ = dict(os.environ if environ is None else environ)
    echo = echo or sys.stdout
    say = lambda msg: print(f"[launcher] {msg}", file=echo, flush=True)  # noqa: E731

    try:
        exp = load_spec(spec_path)
    except SpecError as exc:
        say(f"invalid spec:\n{exc}")
        return EXIT_USAGE
    expected = environ.get(C.ENV_RUN_NAME)
    if expected and expected != run_name(exp):
        say(
            f"{spec_path}: run name {run_name(exp)} does not match {C.ENV_RUN_NAME}={expected} (the job was "
            "submitted with a different spec); resubmit with `longhaul submit`"
        )
        return EXIT_USAGE
    run_dir = Path(run_dir).absolute()
    plan = render_plan(exp, backend, str(run_dir), server_python=_server_python(exp, environ))
    refusal = stage_refusal(exp, stage)
    if refusal:
        say(refusal)
        return EXIT_USAGE
    stages = [s for s in plan.stages if stage is None or s.name == stage]

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        # Held for the launcher's whole life: one launcher per run directory.
        with exclusive_lock(run_dir / LAUNCHER_LOCK_FILE, f"run directory {run_dir}"):
            return _launch_locked(exp, plan, stages, spec_path, backend, run_dir, environ, echo, say)
    except LockBusy as exc:
        say(f"refused: {exc}")
        return EXIT_FAILED
    except OSError as exc:
        if exc.errno != 28:
            raise
        say(
            f"FAILED: no space left on device under the run directory {run_dir} ({exc}); free space there, then "
            "start the run again: it resumes from its newest complete checkpoint"
        )
        return EXIT_FAILED


@dataclass(frozen=True)
class _Tracking:
    """The launch's MLflow side: the tracking URI, its run, the relay to a server, and MLflow's quiet switch."""

    uri: str
    run: Any
    relay: Any
    quiet: dict[str, str]


def _launch_locked(
    exp: Experiment,
    plan: LaunchPlan,
    stages: list[StagePlan],
    spec_path: str | Path,
    backend: str,
    run_dir: Path,
    environ: dict[str, str],
    echo: TextIO,
    say: Any,
) -> int:
    """`launch` once it holds the run directory's lock: the run directory, the MLflow run, the stages' context,
    then the stages, their outcome (FINISHED, SCHEDULED for a requeue, KILLED, FAILED) and the clean stop."""
    _prepare_run_dir(exp, plan, spec_path, run_dir, say)
    tracking = _open_tracking(exp, plan, backend, run_dir, environ, say)
    ctx = _stage_context(exp, plan, backend, run_dir, environ, echo, say, tracking)
    status, rc = "FAILED", EXIT_FAILED
    with handle_signals(ctx.control):
        try:
            _run_stages(ctx, stages, say)
            status, rc = "FINISHED", EXIT_OK
        except (RequeueRequested, StopRequested, KeyboardInterrupt, InterruptedError) as exc:
            status, rc = _stopped(ctx, exc, say)
        except Exception as exc:  # noqa: BLE001 - reported; the run must be marked FAILED
            _report_failure(ctx, exc, backend, echo, say)
        finally:
            _stop_everything(ctx, tracking, status, say)
    ctx.results.status = status
    print_summary(ctx, echo)
    return rc


def _prepare_run_dir(exp: Experiment, plan: LaunchPlan, spec_path: str | Path, run_dir: Path, say: Any) -> None:
    """Reap what a killed launcher of this run left running; write the resolved spec and the plan."""
    leftovers = kill_supervised(run_dir)
    if leftovers:
        say(
            f"killed {len(leftovers)} leftover processes of an earlier launcher of this run (it died without "
            f"stopping them): pids {', '.join(map(str, leftovers))}"
        )
    spec_file = Path(plan.paths.spec_file)
    if not spec_file.exists() or spec_file.resolve() != Path(spec_path).resolve():
        atomic_write_text(spec_file, resolved_yaml(exp))
    atomic_write_json(run_dir / PLAN_FILE, plan.to_dict())


def _open_tracking(
    exp: Experiment, plan: LaunchPlan, backend: str, run_dir: Path, environ: dict[str, str], say: Any
) -> _Tracking:
    """Start or resume the MLflow run, and the relay that keeps training from ever waiting for a server."""
    # deferred: mlflow via tracking.runs/relay (~1 s)
    from longhaul.tracking.relay import start_relay
    from longhaul.tracking.runs import start_or_resume_run

    uri = tracking_env(exp, run_dir, backend, environ=environ)[ENV_TRACKING_URI]
    quiet: dict[str, str] = {}
    if redact_uri(uri) != uri:
        # MLflow prints "View run … at: <tracking URI>" when a run ends: with credentials in the URI (Slurm and local
        # take it from $MLFLOW_TRACKING_URI) that line would put them into the job log. Here and in every stage.
        quiet = {ENV_MLFLOW_QUIET_URL: "true"}
        os.environ.update(quiet)
    tracked = start_or_resume_run(exp, uri, run_dir, backend, environ=environ)
    say(
        f"run {plan.run_name} ({'resumed, attempt ' + str(tracked.attempts) if tracked.resumed else 'new'}); "
        f"MLflow run {tracked.run_id} in {redact_uri(uri)}"
    )
    return _Tracking(uri, tracked, start_relay(uri, tracked.run_id, run_dir, say=say), quiet)


def _stage_context(
    exp: Experiment,
    plan: LaunchPlan,
    backend: str,
    run_dir: Path,
    environ: dict[str, str],
    echo: TextIO,
    say: Any,
    tracking: _Tracking,
) -> StageContext:
    """What every stage gets: the environment of its processes, the servers, the stop control."""
    env = {
        **environ,
        **plan.env,
        **tracking_env(exp, run_dir, backend, run_id=tracking.run.run_id, environ=environ),
        **tracking.relay.trainer_env,
        **tracking.quiet,
    }
    env.update(build_server_env(exp, plan))
    env[C.ENV_SUPERVISED_BY] = str(run_dir)
    if plan.servers:  # a trainer started beside the servers waits for them as long as the launcher does
        env[C.ENV_SERVER_WAIT_S] = f"{max(sp.startup_timeout_s for sp in plan.servers):g}"
    ctx = StageContext(
        exp,
        plan,
        run_dir,
        tracking.uri,
        tracking.run.run_id,
        env,
        StopControl(),
        plan.simulator_base_url,
        exp.spec.user_simulator.model.name,
        echo,
        experiment_id=tracking.run.experiment_id,
        inherited_env=environ,
    )
    ctx.start_policy = lambda: _start_policy(ctx, say)
    return ctx


def _start_policy(ctx: StageContext, say: Any) -> PolicyServer:
    """The policy server, started on the first stage that asks for it, healthy before it is handed out."""
    server = PolicyServer(ctx.plan.policy_server, ctx.env, ctx.plan.paths.logs_dir, echo=ctx.echo)
    ctx.servers.append(server)
    say(f"starting policy server on {server.base_url}")
    server.start()
    took = server.wait_healthy(abort=lambda: ctx.control.requested)
    server.serving = "base"
    say(f"policy server healthy after {took:.0f} s")
    return server


def _start_servers(ctx: StageContext, say: Any) -> None:
    """Start the plan's servers; their health is awaited in the background (`StartupWatch`): a stage that can
    start beside them does (veRL), every other one waits for them (`_run_stages`)."""
    logs_dir = Path(ctx.plan.paths.logs_dir)
    for sp in ctx.plan.servers:
        server = ManagedServer(sp, ctx.env, logs_dir, echo=ctx.echo)
        ctx.servers.append(server)
        say(f"starting {sp.role} server on {sp.base_url} (log: {logs_dir / (sp.role + '.log')})")
        server.start()
    ctx.startup = StartupWatch(list(ctx.servers), abort=lambda: ctx.control.requested, say=say)


def _run_stages(ctx: StageContext, stages: list[StagePlan], say: Any) -> None:
    """The stages not yet done, in order, each restarted after a server crash within the launch's budget."""
    todo = [s for s in stages if not _done_marker(ctx.run_dir, s.name).exists()]
    for s in stages:
        if s not in todo:
            say(f"stage {s.name}: already done ({_done_marker(ctx.run_dir, s.name)}), skipped")
    if todo:
        _start_servers(ctx, say)
    restarts = _Restarts(ctx, say)
    for s in todo:
        ctx.control.check()
        if ctx.control.checkpoint.is_set():
            raise RequeueRequested(s.name)
        if s.name not in STARTS_BESIDE_SERVERS:
            ctx.servers_ready()
        say(f"stage {s.name}: start")
        t0 = time.monotonic()
        while True:
            try:
                STAGES[s.name](ctx, s)
                break
            except (StopRequested, RequeueRequested, KeyboardInterrupt, InterruptedError):
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised unless a server crash explains it
                if ctx.control.requested or not restarts.after(s, exc):
                    raise
        atomic_write_text(_done_marker(ctx.run_dir, s.name), f"{time.time():.0f}\n")
        say(f"stage {s.name}: done in {time.monotonic() - t0:.0f} s")


class _Restarts:
    """The launch's budget of server restarts (`MAX_SERVER_RESTARTS`, all servers together)."""

    def __init__(self, ctx: StageContext, say: Any) -> None:
        self.ctx, self.say, self.count = ctx, say, 0

    def after(self, s: StagePlan, exc: BaseException) -> bool:
        """After a stage failed: restart the servers that crashed and say so (True), within the launch's budget;
        raise ServerCrashed past it; False when no server crashed (the failure is the stage's own)."""
        ctx, say = self.ctx, self.say
        crashed = exc.servers if isinstance(exc, ServerCrashed) else [sv for sv in ctx.servers if sv.crashed]
        if not crashed:
            return False
        what = "; ".join(sv.describe_crash(s.name) for sv in crashed)
        if self.count >= MAX_SERVER_RESTARTS:
            raise ServerCrashed(
                f"{what}, after {self.count} restarts in this launch (at most "
                f"{MAX_SERVER_RESTARTS}). The checkpoints are intact; the newest complete one: {newest_checkpoint(ctx)}. "  # noqa: E501 - a string literal kept whole
                f"Look at the server's log, then start the run again: it resumes from there",
                crashed,
            ) from exc
        self.count += 1
        for sv in crashed:
            say(
                f"{sv.describe_crash(s.name)}: restarting it ({self.count}/{MAX_SERVER_RESTARTS} restarts in this "
                "launch)"
            )
            took = sv.restart(abort=lambda: ctx.control.requested)
            say(f"{sv.role} server healthy again after {took:.0f} s")
        say(f"stage {s.name}: starting again (newest complete checkpoint: {newest_checkpoint(ctx)})")
        return True


def _stopped(ctx: StageContext, exc: BaseException, say: Any) -> tuple[str, int]:
    """(status, exit code) after a stop or checkpoint request. A server start-up cut short (InterruptedError) by
    SIGUSR1 alone is a checkpoint request like any other: requeue, never "killed" (the pre-limit signal can arrive
    while the eval stage starts its server)."""
    control = ctx.control
    requeue = isinstance(exc, RequeueRequested) or (
        isinstance(exc, InterruptedError) and control.checkpoint.is_set() and not control.stop.is_set()
    )
    if requeue:
        say(
            f"checkpoint requested (SIGUSR1) during {exc}: stopped; the newest complete checkpoint "
            f"({newest_checkpoint(ctx)}) is the resume point, exiting {EXIT_REQUEUE} (requeue me)"
        )
        return "SCHEDULED", EXIT_REQUEUE
    control.request_stop("SIGINT")
    say(f"stopped by {control.signal_name}: servers stopped, run marked KILLED")
    return "KILLED", control.stop_exit_code


def _report_failure(ctx: StageContext, exc: BaseException, backend: str, echo: TextIO, say: Any) -> None:
    """One FAILED line that says what to do: a full disk, a server that crashed or did not start, a failed stage
    (and where training resumes), else the error (with its traceback, unless it is a checkpoint problem)."""
    if looks_like_no_space(exc, ctx):
        say(f"FAILED: {disk_full_hint(ctx, backend)}\n--- the error ---\n{exc}")
    elif isinstance(exc, ServerCrashed):
        say(f"FAILED: {exc}")
    elif isinstance(exc, ServerStartError | StageFailed):
        say(f"FAILED: {exc}")
        if any(st.name == "grpo" for st in ctx.plan.stages):
            say(
                f"checkpoints: the newest complete one is {newest_checkpoint(ctx)}; starting the run again "
                "resumes from it"
            )
    else:
        if not isinstance(exc, CheckpointError):
            traceback.print_exc(file=echo)
        say(f"FAILED: {type(exc).__name__}: {exc}")


def _stop_everything(ctx: StageContext, tracking: _Tracking, status: str, say: Any) -> None:
    """Stop the servers and whatever the stages left behind (by PID), set the MLflow run's status, close the
    relay. Never raises past a failed status write: the exit code must still reach the scheduler."""
    from longhaul.tracking.runs import finish_run  # deferred: mlflow via tracking.runs (~1 s)

    for server in reversed(ctx.servers):
        server.stop()
    if ctx.servers:
        say("servers stopped")
    stray = kill_supervised(ctx.run_dir, timeout_s=10)
    if stray:
        say(f"killed {len(stray)} processes its children left behind: pids {', '.join(map(str, stray))}")
    try:
        if status == "SCHEDULED":
            _mark_requeued(tracking.uri, tracking.run.run_id)
        else:
            finish_run(tracking.uri, tracking.run.run_id, status)
    except Exception as exc:  # noqa: BLE001 - the exit code must still reach the scheduler
        say(f"warning: could not set MLflow run status {status}: {exc}")
    tracking.relay.close()
