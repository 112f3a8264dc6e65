"""`longhaul launch`: execute a launch plan (servers → stages → clean stop). Protocol: see the package docstring.

Size: over 400 lines because the launch sequence (servers, stages, restarts, clean stop) reads top to bottom; the
stages themselves are in launcher/stages.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from longhaul import constants as C
from longhaul.files import atomic_write_json, atomic_write_text
from longhaul.launcher.console import STEP_COLUMNS
from longhaul.launcher.context import StageContext
from longhaul.launcher.control import RequeueRequested, StopControl, StopRequested, handle_signals
from longhaul.launcher.files import LockBusy, exclusive_lock
from longhaul.launcher.processes import NO_SPACE_MARKERS, kill_supervised
from longhaul.launcher.servers import ManagedServer, PolicyServer, ServerStartError, StartupWatch
from longhaul.launcher.stages import STAGES, STARTS_BESIDE_SERVERS, ServerCrashed, StageFailed
from longhaul.layout import DONE_SUFFIX, LAUNCHER_LOCK_FILE, PLAN_FILE, STAGES_DIR
from longhaul.protocol import EXIT_FAILED, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE
from longhaul.render.plan import LaunchPlan, StagePlan, render_plan, stage_refusal
from longhaul.spec import Experiment, SpecError, load_spec, resolved_yaml, run_name

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
    from longhaul.tracking.runs import mark_requeued

    mark_requeued(uri, run_id)


def _newest_checkpoint(ctx: StageContext) -> str:
    """`step N (<dir>)` or `none`, for failure messages (never raises)."""
    from longhaul.checkpoints import latest_step, step_dir

    try:
        step = latest_step(ctx.checkpoint_dir)
    except (OSError, ValueError):
        step = None
    return "none" if step is None else f"step {step} ({step_dir(ctx.checkpoint_dir, step)})"


def _space(ctx: StageContext) -> tuple[Path, int | None, int | None]:
    """(where, free bytes, bytes of the newest complete checkpoint) for the checkpoint filesystem; never raises."""
    import shutil

    from longhaul.checkpoints import latest_step, step_dir

    where = ctx.checkpoint_dir if ctx.checkpoint_dir.exists() else ctx.run_dir
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    try:
        step = latest_step(ctx.checkpoint_dir)
        size = (
            None
            if step is None
            else sum(f.stat().st_size for f in step_dir(ctx.checkpoint_dir, step).rglob("*") if f.is_file())
        )
    except (OSError, ValueError):
        size = None
    return where, free, size


#: With less than this free (or less than one checkpoint), a failed save is taken for a full disk.
_LOW_SPACE_BYTES = 16 * 2**20


def _looks_like_no_space(exc: BaseException, ctx: StageContext) -> bool:
    """ENOSPC named in the error or the stage's output, or the checkpoint filesystem has less room than one more
    checkpoint (torch's zip writer reports a short write only as `unexpected pos …`, without the errno)."""
    if isinstance(exc, OSError) and exc.errno == 28:
        return True
    if isinstance(exc, StageFailed) and exc.no_space:
        return True
    if any(m in str(exc) for m in NO_SPACE_MARKERS):
        return True
    _, free, size = _space(ctx)
    return free is not None and free < max(size or 0, _LOW_SPACE_BYTES)


def _disk_full_hint(ctx: StageContext, backend: str) -> str:
    """What to do when the disk under the run directory is full."""
    from longhaul.checkpoints import latest_step

    where, free, size = _space(ctx)
    try:
        step = latest_step(ctx.checkpoint_dir)
    except (OSError, ValueError):
        step = None
    room = "free space unknown" if free is None else f"{free / 2**20:.1f} MiB free"
    if size is not None:
        room += f"; one checkpoint takes {size / 2**20:.1f} MiB"
    kept = (
        f"the newest complete checkpoint, step {step}, is intact"
        if step is not None
        else "no complete checkpoint was saved yet"
    )
    again = "`longhaul run SPEC`" if backend == "local" else "`longhaul submit SPEC`"
    return (
        f"no space left on device under the run directory {ctx.run_dir} ({where}: {room}); {kept}. "
        f"Free space there (or point the backend's output_dir at a larger disk), then start the run again "
        f"with {again}: it resumes from {'step ' + str(step) if step is not None else 'the start'}"
    )


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
    """`launch` once it holds the run directory's lock."""
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

    from longhaul.redact import redact_uri
    from longhaul.tracking.config import ENV_TRACKING_URI, tracking_env
    from longhaul.tracking.runs import finish_run, start_or_resume_run

    tenv = tracking_env(exp, run_dir, backend, environ=environ)
    uri = tenv[ENV_TRACKING_URI]
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
    from longhaul.tracking.relay import start_relay  # a server is relayed: training never waits for it

    relay = start_relay(uri, tracked.run_id, run_dir, say=say)
    env = {
        **environ,
        **plan.env,
        **tracking_env(exp, run_dir, backend, run_id=tracked.run_id, environ=environ),
        **relay.trainer_env,
        **quiet,
    }
    env.update(build_server_env(exp, plan))
    env[C.ENV_SUPERVISED_BY] = str(run_dir)
    if plan.servers:  # a trainer started beside the servers waits for them as long as the launcher does
        env[C.ENV_SERVER_WAIT_S] = f"{max(sp.startup_timeout_s for sp in plan.servers):g}"
    logs_dir = Path(plan.paths.logs_dir)
    servers: list[ManagedServer] = []
    control = StopControl()

    def make_policy() -> PolicyServer:
        server = PolicyServer(plan.policy_server, env, logs_dir, echo=echo)
        servers.append(server)
        say(f"starting policy server on {server.base_url}")
        server.start()
        took = server.wait_healthy(abort=lambda: control.requested)
        server.serving = "base"
        say(f"policy server healthy after {took:.0f} s")
        return server

    ctx = StageContext(
        exp,
        plan,
        run_dir,
        uri,
        tracked.run_id,
        env,
        control,
        plan.simulator_base_url,
        exp.spec.user_simulator.model.name,
        echo,
        start_policy=make_policy,
        experiment_id=tracked.experiment_id,
        servers=servers,
        inherited_env=environ,
    )
    restarts = 0

    def run_stage(s: StagePlan) -> None:
        STAGES[s.name](ctx, s)

    def restart_crashed(s: StagePlan, exc: BaseException) -> bool:
        """After a stage failed: restart the servers that crashed and say so (True), within the launch's budget;
        raise ServerCrashed past it; False when no server crashed (the failure is the stage's own)."""
        nonlocal restarts
        crashed = exc.servers if isinstance(exc, ServerCrashed) else [sv for sv in servers if sv.crashed]
        if not crashed:
            return False
        what = "; ".join(sv.describe_crash(s.name) for sv in crashed)
        if restarts >= MAX_SERVER_RESTARTS:
            raise ServerCrashed(
                f"{what}, after {restarts} restarts in this launch (at most "
                f"{MAX_SERVER_RESTARTS}). The checkpoints are intact; the newest complete one: {_newest_checkpoint(ctx)}. "  # noqa: E501 - a string literal kept whole
                f"Look at the server's log, then start the run again: it resumes from there",
                crashed,
            ) from exc
        restarts += 1
        for sv in crashed:
            say(
                f"{sv.describe_crash(s.name)}: restarting it ({restarts}/{MAX_SERVER_RESTARTS} restarts in this launch)"
            )
            took = sv.restart(abort=lambda: control.requested)
            say(f"{sv.role} server healthy again after {took:.0f} s")
        say(f"stage {s.name}: starting again (newest complete checkpoint: {_newest_checkpoint(ctx)})")
        return True

    status, rc = "FAILED", EXIT_FAILED
    with handle_signals(control):
        try:
            todo = [s for s in stages if not _done_marker(run_dir, s.name).exists()]
            for s in stages:
                if s not in todo:
                    say(f"stage {s.name}: already done ({_done_marker(run_dir, s.name)}), skipped")
            if todo:
                for sp in plan.servers:
                    server = ManagedServer(sp, env, logs_dir, echo=echo)
                    servers.append(server)
                    say(f"starting {sp.role} server on {sp.base_url} (log: {logs_dir / (sp.role + '.log')})")
                    server.start()
                # Their health is awaited in the background: a stage that can start beside them does (veRL).
                ctx.startup = StartupWatch(list(servers), abort=lambda: control.requested, say=say)
            for s in todo:
                control.check()
                if control.checkpoint.is_set():
                    raise RequeueRequested(s.name)
                if s.name not in STARTS_BESIDE_SERVERS:
                    ctx.servers_ready()
                say(f"stage {s.name}: start")
                t0 = time.monotonic()
                while True:
                    try:
                        run_stage(s)
                        break
                    except (StopRequested, RequeueRequested, KeyboardInterrupt, InterruptedError):
                        raise
                    except Exception as exc:  # noqa: BLE001 - re-raised unless a server crash explains it
                        if control.requested or not restart_crashed(s, exc):
                            raise
                atomic_write_text(_done_marker(run_dir, s.name), f"{time.time():.0f}\n")
                say(f"stage {s.name}: done in {time.monotonic() - t0:.0f} s")
            status, rc = "FINISHED", EXIT_OK
        except (RequeueRequested, StopRequested, KeyboardInterrupt, InterruptedError) as exc:
            # A server start-up cut short (InterruptedError) by SIGUSR1 alone is a checkpoint request like any
            # other: requeue, never "killed" (the pre-limit signal can arrive while the eval stage starts its server).
            requeue = isinstance(exc, RequeueRequested) or (
                isinstance(exc, InterruptedError) and control.checkpoint.is_set() and not control.stop.is_set()
            )
            if requeue:
                say(
                    f"checkpoint requested (SIGUSR1) during {exc}: stopped; the newest complete checkpoint "
                    f"({_newest_checkpoint(ctx)}) is the resume point, exiting {EXIT_REQUEUE} (requeue me)"
                )
                status, rc = "SCHEDULED", EXIT_REQUEUE
            else:
                control.request_stop("SIGINT")
                say(f"stopped by {control.signal_name}: servers stopped, run marked KILLED")
                status, rc = "KILLED", control.stop_exit_code
        except Exception as exc:  # noqa: BLE001 - reported; the run must be marked FAILED
            if _looks_like_no_space(exc, ctx):
                say(f"FAILED: {_disk_full_hint(ctx, backend)}\n--- the error ---\n{exc}")
            elif isinstance(exc, ServerCrashed):
                say(f"FAILED: {exc}")
            elif isinstance(exc, ServerStartError | StageFailed):
                say(f"FAILED: {exc}")
                if any(st.name == "grpo" for st in plan.stages):
                    say(
                        f"checkpoints: the newest complete one is {_newest_checkpoint(ctx)}; starting the run again "
                        "resumes from it"
                    )
            else:
                import traceback

                from longhaul.checkpoints import CheckpointError

                if not isinstance(exc, CheckpointError):
                    traceback.print_exc(file=echo)
                say(f"FAILED: {type(exc).__name__}: {exc}")
        finally:
            for server in reversed(servers):
                server.stop()
            if servers:
                say("servers stopped")
            stray = kill_supervised(run_dir, timeout_s=10)
            if stray:
                say(f"killed {len(stray)} processes its children left behind: pids {', '.join(map(str, stray))}")
            try:
                if status == "SCHEDULED":
                    _mark_requeued(uri, tracked.run_id)
                else:
                    finish_run(uri, tracked.run_id, status)
            except Exception as exc:  # noqa: BLE001 - the exit code must still reach the scheduler
                say(f"warning: could not set MLflow run status {status}: {exc}")
            relay.close()
    ctx.results.status = status
    _print_summary(ctx, echo)
    return rc


def _print_summary(ctx: StageContext, echo: TextIO) -> None:
    """The end-of-run tables: veRL's own per-step metrics (score, advantages, policy loss, gradient norm, the
    KL between the policy before and after each optimizer step), then the learning curve (`longhaul.eval.curve`:
    per step the training episodes' mean reward and outcome and how they ended; per evaluated checkpoint pass^1
    with c/n per subset beside the do-nothing agent's floor and how the evaluated episodes ended), then how to
    open MLflow."""
    from rich.console import Console
    from rich.table import Table

    from longhaul.eval.curve import training_metric_keys
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
    curve = _learning_curve_table(ctx, metrics)
    if curve is not None:
        console.print(curve)
        from longhaul.machine import machine_line

        console.print(f"machine: {machine_line()}")  # a tiny model's curve depends on the CPU's arithmetic
    console.print(f"status: {ctx.results.status}; run directory: {ctx.run_dir}")
    from longhaul.tracking.config import build_ui_hint

    console.print(
        f"MLflow UI: {build_ui_hint(ctx.tracking_uri, ctx.experiment_id)}   (run id {ctx.run_id})", soft_wrap=True
    )


def _learning_curve_table(ctx: StageContext, metrics: dict[int, dict[str, float]]) -> Any:
    """The learning curve as a rich Table (None when nothing was trained or evaluated)."""
    from rich.table import Table

    from longhaul.eval.curve import (
        TRAIN_EPISODES,
        build_learning_curve,
        format_subset,
        format_terminations,
        subset_floors,
    )

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
