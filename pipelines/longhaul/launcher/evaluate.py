"""The `eval` stage inside the launcher: evaluate the selected checkpoints with the shared episode runner.

For every selected checkpoint (step 0 = the initial policy): veRL's FSDP shards of the step are merged into a
Hugging Face directory (`longhaul.checkpoints`: `<run_dir>/merged/global_step_N/`, reused when present), the
policy server serves those weights, every task of the split runs `samples_per_task` trials per evaluation seed
(validation sampling) through the evaluation driver `longhaul eval` uses too (`longhaul.eval.driver`), the records
go to `<eval_dir>/step_<N>/results.jsonl` (published whole when complete: `longhaul.files.atomic_output`), and the
summary (pass^k, pass@k, subsets, bootstrap CIs, null-agent floor: `longhaul.eval.driver.summarize`, seeded with the
first evaluation seed, exactly as `longhaul eval` computes it) is logged as an MLflow child run of the training run
(`longhaul.tracking`), and every episode as an MLflow trace linked to that child run (`longhaul.launcher.traces`;
counted as `eval/traces_logged` / `eval/traces_dropped` and in `summary.json`). A checkpoint whose summary exists is
skipped and a finished merge is reused, so a requeued job continues where it stopped.

Then the best checkpoint is selected on `evaluation.select_on` (pass^1, ties → earliest step; never a subset
holding test tasks: `longhaul.analysis.selection`), printed, and recorded on the training run as the tags
`longhaul.select_on` / `longhaul.selected_step` / `longhaul.selected_pass_hat_1` and the metric
`selection/pass_hat_1` (`longhaul.tracking.runs.log_selection`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from longhaul.analysis.selection import build_selection, build_selection_message, check_select_on
from longhaul.checkpoints import MergeAborted, merge_checkpoint, merged_model_dir, saved_steps
from longhaul.constants import ENV_USER_SIM_API_KEY
from longhaul.envs.airline.env import AirlineEnv
from longhaul.envs.airline.splits import build_split
from longhaul.envs.airline.tasks import base_db
from longhaul.envs.limits import EpisodeLimits
from longhaul.eval.evaluate import EvalPlan, build_run_info
from longhaul.files import PLAIN, atomic_output, atomic_write_json
from longhaul.launcher.control import RequeueRequested
from longhaul.launcher.traces import log_episode_traces
from longhaul.layout import EVAL_RESULTS_FILE, EVAL_SUMMARY_FILE
from longhaul.render.verl import policy_model_path

if TYPE_CHECKING:
    from longhaul.eval.evaluate import EvalPlan
    from longhaul.launcher.context import StageContext


class EvalStopped(Exception):  # noqa: N818 - control flow
    """A stop or checkpoint request arrived during an evaluation; its partial records are discarded."""


def select_checkpoints(which: Any, saved: list[int]) -> list[int]:
    """Steps to evaluate: 'all' = 0 and every saved step, 'last' = the newest (0 if none), or an explicit list."""
    if which == "all":
        return [0, *saved]
    if which == "last":
        return [saved[-1] if saved else 0]
    missing = [s for s in which if s != 0 and s not in saved]
    if missing:
        raise ValueError(
            f"spec.evaluation.checkpoints: steps {missing} have no checkpoint (saved: {saved or 'none'}); "
            "use 'all', 'last' or saved steps (0 = the initial policy)"
        )
    return list(which)


def fetch_checkpoint_model(ctx: StageContext, step: int) -> Path:
    """The Hugging Face directory to serve for `step`: the spec's model for 0, else the step's merge (made now
    if missing; a stop request interrupts it and requeues)."""
    spec = ctx.exp.spec
    if step == 0:
        return Path(spec.policy.model.path or spec.policy.model.name)
    try:
        return merge_checkpoint(
            ctx.checkpoint_dir,
            step,
            merged_model_dir(ctx.run_dir, step),
            base_model=policy_model_path(ctx.exp, ctx.paths),
            abort=lambda: ctx.control.requested,
        )
    except MergeAborted:
        ctx.control.check()
        raise RequeueRequested(f"eval step {step} (merging)") from None


@dataclass(frozen=True)
class EvalStage:
    """What every checkpoint's evaluation shares: the policy server, the split, the trials, the limits, the run
    facts each record carries, the environment factory (one base database for all episodes), the `select_on` rule
    (and why it cannot select, if so), and the checkpoints to evaluate, those the policy server serves first."""

    policy: Any
    split: Any
    plan: EvalPlan
    limits: Any
    run_info: dict[str, Any]
    env_factory: Callable[[], Any]
    select_on: str
    not_selectable: str | None
    steps: list[int]


def run_eval_stage(ctx: StageContext) -> None:
    """Evaluate the spec's checkpoints (module docstring): prepare, evaluate each checkpoint, select one."""
    say = lambda m: print(f"[eval] {m}", file=ctx.echo, flush=True)  # noqa: E731
    stage = prepare_eval_stage(ctx, say)
    summaries = ctx.results.eval_summaries
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        for step in stage.steps:
            summaries[step] = evaluate_checkpoint(ctx, stage, step, progress, say)
            say(f"step {step}: pass^k {summaries[step]['pass_hat_k']} ({summaries[step]['c_over_n']} trials succeeded)")
    record_selection(ctx, stage, summaries, say)


def prepare_eval_stage(ctx: StageContext, say: Callable[[str], None]) -> EvalStage:
    """The stage's shared setup (`EvalStage`); warns when `select_on` cannot select. Starts the policy server."""
    exp = ctx.exp
    ev = exp.spec.evaluation
    steps = select_checkpoints(ev.checkpoints, saved_steps(ctx.checkpoint_dir))
    split = build_split(exp.spec.environment.split)
    select_on = str(ev.select_on)
    not_selectable = check_select_on(select_on, split.subsets, split.test)
    if not_selectable:
        say(f"warning: {not_selectable}; no checkpoint will be selected")
    limits = EpisodeLimits.from_spec(exp)
    plan = EvalPlan(task_ids=split.all_ids, samples=ev.samples_per_task, seeds=list(ev.seeds))
    base = base_db()
    # The weights already served go first (no reload needed).
    policy = ctx.policy_server()
    served = policy.serving
    steps.sort(key=lambda s: (0 if (served == "base" and s == 0) or served == f"step {s}" else 1, s))
    run_info = build_run_info(exp.spec.policy.model.name, exp.spec.user_simulator.model.name, limits, split)
    return EvalStage(policy, split, plan, limits, run_info, lambda: AirlineEnv(base), select_on, not_selectable, steps)


def evaluate_checkpoint(
    ctx: StageContext, stage: EvalStage, step: int, progress: Any, say: Callable[[str], None]
) -> dict[str, Any]:
    """The summary of checkpoint `step`: read back when its evaluation finished before, else the checkpoint served,
    its trials run (`run_trials`), the summary logged to MLflow with the episode traces and written last (its
    presence marks the step done)."""
    # deferred: mlflow via tracking.runs (~1 s), httpx via the evaluation driver
    from longhaul.eval.driver import summarize
    from longhaul.tracking.runs import log_evaluation

    out = Path(ctx.paths.eval_step_dir(step))
    summary_file = out / EVAL_SUMMARY_FILE
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        say(f"step {step}: already evaluated ({summary_file})")
        return summary
    if ctx.control.checkpoint.is_set():
        raise RequeueRequested(f"eval step {step}")
    ctx.control.check()
    t0 = time.monotonic()
    serve_checkpoint(ctx, stage.policy, step, say)
    bar = progress.add_task(f"eval {step_label(step)}", total=len(stage.plan.trials()))
    records, episodes = run_trials(ctx, stage, step, lambda: progress.advance(bar))
    summary = summarize(records, ctx.exp.spec.evaluation.k, ctx.exp.spec.evaluation, stage.plan.seeds)
    summary["checkpoint_step"] = step
    summary["seconds"] = round(time.monotonic() - t0, 1)
    eval_run = log_evaluation(ctx.run_id, step, summary, out / EVAL_RESULTS_FILE, tracking_uri=ctx.tracking_uri)
    summary["traces"] = log_episode_traces(ctx, step, episodes, stage.split, eval_run, say)
    atomic_write_json(summary_file, summary)
    progress.remove_task(bar)
    return summary


def serve_checkpoint(ctx: StageContext, policy: Any, step: int, say: Callable[[str], None]) -> None:
    """Have the policy server serve checkpoint `step` (merged first when needed; nothing to do when it does)."""
    label = step_label(step)
    if policy.serving != label:
        t_merge = time.monotonic()
        src = fetch_checkpoint_model(ctx, step)
        if step != 0:
            say(f"step {step}: model {src} ({time.monotonic() - t_merge:.1f} s to merge or find)")
        took = policy.serve_weights(src, label, abort=lambda: ctx.control.requested)
        say(f"step {step}: policy server serves {label} ({took:.1f} s)")


def run_trials(
    ctx: StageContext, stage: EvalStage, step: int, advance: Callable[[], None]
) -> tuple[list[dict[str, Any]], list[Any]]:
    """Every trial of checkpoint `step` through the evaluation driver (`longhaul.eval.driver`), `advance` called
    after each: the records, published to `results.jsonl` whole (`longhaul.files.atomic_output`), and the
    trajectories. A stop or checkpoint request stops the trials and requeues; the partial records are dropped."""
    # deferred: httpx via the evaluation driver (~0.1 s)
    from longhaul.eval.driver import Endpoint, EvalJob, run_evaluation

    episodes: list[Any] = []
    policy = stage.policy

    def done(traj: Any) -> None:
        episodes.append(traj)
        advance()
        if ctx.control.requested:
            raise EvalStopped(step)

    out = Path(ctx.paths.eval_step_dir(step))
    with atomic_output(out / EVAL_RESULTS_FILE, mode=PLAIN) as partial:
        job = EvalJob(
            spec=ctx.exp.spec,
            plan=stage.plan,
            split=stage.split,
            limits=stage.limits,
            policy=Endpoint(policy.base_url, policy.served_model_name),
            user=Endpoint(ctx.simulator_base_url, ctx.simulator_model, os.environ.get(ENV_USER_SIM_API_KEY)),
            concurrency=ctx.exp.spec.evaluation.concurrency,
            results_path=partial,
            run_info={**stage.run_info, "checkpoint_step": step},
            env_factory=stage.env_factory,
        )
        try:
            records = run_evaluation(job, on_done=done)
        except EvalStopped:
            ctx.control.check()
            raise RequeueRequested(f"eval step {step}") from None
    return records, episodes


def record_selection(
    ctx: StageContext, stage: EvalStage, summaries: dict[int, dict[str, Any]], say: Callable[[str], None]
) -> None:
    """The best checkpoint on `select_on` (none when the rule cannot select), recorded on the training run, kept in
    the stage's results and printed."""
    # deferred: mlflow via tracking.runs (~1 s)
    from longhaul.tracking.runs import log_selection

    selection = None if stage.not_selectable else build_selection(summaries, stage.select_on)
    log_selection(ctx.tracking_uri, ctx.run_id, stage.select_on, selection, stage.not_selectable)
    ctx.results.selection = (
        None
        if selection is None
        else {"select_on": stage.select_on, "step": selection.step, "pass^1": selection.pass_hat_1}
    )
    say(build_selection_message(selection, stage.select_on, stage.not_selectable))


def step_label(step: int) -> str:
    """What the policy server says it serves for checkpoint `step`: `base` for 0, else `step <N>`."""
    return "base" if step == 0 else f"step {step}"
