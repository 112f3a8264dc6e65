"""The `eval` stage inside the launcher: evaluate the selected checkpoints with the shared episode runner.

For every selected checkpoint (step 0 = the initial policy): veRL's FSDP shards of the step are merged into a
Hugging Face directory (`longhaul.checkpoints`: `<run_dir>/merged/global_step_N/`, reused when present), the
policy server serves those weights, every task of the split runs `samples_per_task` trials per evaluation seed
(validation sampling), the records go to `<eval_dir>/step_<N>/results.jsonl` (renamed into place when
complete), and the summary (pass^k, pass@k, subsets, bootstrap CIs, null-agent floor:
`longhaul.eval.evaluate.summarize_evaluation`, seeded with the first evaluation seed, exactly as `longhaul eval`
computes it) is logged as an MLflow child run of the training run (`longhaul.tracking`), and every episode as an
MLflow trace linked to that child run (`longhaul.launcher.traces`; counted as `eval/traces_logged` /
`eval/traces_dropped` and in `summary.json`). A checkpoint whose summary exists is skipped and a finished merge is
reused, so a requeued job continues where it stopped.

Then the best checkpoint is selected on `evaluation.select_on` (pass^1, ties → earliest step; never a subset
holding test tasks: `longhaul.tracking.selection`), printed, and recorded on the training run as the tags
`longhaul.select_on` / `longhaul.selected_step` / `longhaul.selected_pass_hat_1` and the metric
`selection/pass_hat_1` (`longhaul.tracking.runs.log_selection`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from longhaul.checkpoints import MergeAborted, merge_checkpoint, merged_model_dir, saved_steps
from longhaul.constants import ENV_USER_SIM_API_KEY
from longhaul.files import atomic_write_json
from longhaul.launcher.control import RequeueRequested
from longhaul.layout import EVAL_RESULTS_FILE, EVAL_SUMMARY_FILE

if TYPE_CHECKING:
    from longhaul.launcher.stages import StageContext


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
    from longhaul.render.verl import policy_model_path

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


def run_eval_stage(ctx: StageContext) -> None:
    """Evaluate the spec's checkpoints (module docstring)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from longhaul.clients.openai_compat import ChatClient
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.airline.tasks import base_db
    from longhaul.envs.runner import EpisodeLimits
    from longhaul.eval.evaluate import (
        EvalPlan,
        build_eval_agents,
        build_run_info,
        evaluate,
        summarize_evaluation,
    )
    from longhaul.eval.metrics import bootstrap_seed
    from longhaul.launcher.traces import log_episode_traces
    from longhaul.tracking.runs import log_evaluation, log_selection
    from longhaul.tracking.selection import build_selection, build_selection_message, check_select_on

    exp, control = ctx.exp, ctx.control
    spec = exp.spec
    ev = spec.evaluation
    say = lambda m: print(f"[eval] {m}", file=ctx.echo, flush=True)  # noqa: E731
    steps = select_checkpoints(ev.checkpoints, saved_steps(ctx.checkpoint_dir))
    split = build_split(spec.environment.split)
    select_on = str(ev.select_on)
    not_selectable = check_select_on(select_on, split.subsets, split.test)
    if not_selectable:
        say(f"warning: {not_selectable}; no checkpoint will be selected")
    limits = EpisodeLimits.from_spec(exp)
    plan = EvalPlan(task_ids=split.all_ids, samples=ev.samples_per_task, seeds=list(ev.seeds))
    base = base_db()
    policy = ctx.policy_server()
    # The weights already served go first (no reload needed).
    served = policy.serving
    steps.sort(key=lambda s: (0 if (served == "base" and s == 0) or served == f"step {s}" else 1, s))
    summaries = ctx.results.eval_summaries
    run_info = build_run_info(spec.policy.model.name, spec.user_simulator.model.name, limits, split)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        for step in steps:
            out = Path(ctx.paths.eval_step_dir(step))
            summary_file = out / EVAL_SUMMARY_FILE
            if summary_file.is_file():
                summary = json.loads(summary_file.read_text())
                say(f"step {step}: already evaluated ({summary_file})")
            else:
                if control.checkpoint.is_set():
                    raise RequeueRequested(f"eval step {step}")
                control.check()
                label = "base" if step == 0 else f"step {step}"
                t0 = time.monotonic()
                if policy.serving != label:
                    t_merge = time.monotonic()
                    src = fetch_checkpoint_model(ctx, step)
                    if step != 0:
                        say(f"step {step}: model {src} ({time.monotonic() - t_merge:.1f} s to merge or find)")
                    took = policy.serve_weights(src, label, abort=lambda: control.requested)
                    say(f"step {step}: policy server serves {label} ({took:.1f} s)")
                out.mkdir(parents=True, exist_ok=True)
                partial = out / ".results.jsonl.partial"
                partial.unlink(missing_ok=True)
                bar = progress.add_task(f"eval {label}", total=len(plan.trials()))

                episodes: list[Any] = []

                async def go(bar=bar, partial=partial, step=step, episodes=episodes):
                    async with (
                        ChatClient(policy.base_url, policy.served_model_name, role="policy") as pc,
                        ChatClient(
                            ctx.simulator_base_url,
                            ctx.simulator_model,
                            role="user simulator",
                            api_key=os.environ.get(ENV_USER_SIM_API_KEY),
                        ) as uc,
                    ):  # as in training
                        pol, user = build_eval_agents(spec, pc, uc)

                        def done(traj):
                            episodes.append(traj)
                            progress.advance(bar)
                            if control.requested:
                                raise EvalStopped(step)

                        return await evaluate(
                            plan,
                            policy=pol,
                            user=user,
                            limits=limits,
                            split=split,
                            concurrency=ev.concurrency,
                            results_path=partial,
                            run_info={**run_info, "checkpoint_step": step},
                            on_done=done,
                            env_factory=lambda: AirlineEnv(base),
                        )

                try:
                    records = asyncio.run(go())
                except EvalStopped:
                    control.check()
                    raise RequeueRequested(f"eval step {step}") from None
                partial.replace(out / EVAL_RESULTS_FILE)
                summary = summarize_evaluation(
                    records,
                    ev.k,
                    bootstrap=ev.bootstrap_samples,
                    confidence=ev.confidence,
                    seed=bootstrap_seed(plan.seeds),
                )
                summary["checkpoint_step"] = step
                summary["seconds"] = round(time.monotonic() - t0, 1)
                eval_run = log_evaluation(
                    ctx.run_id, step, summary, out / EVAL_RESULTS_FILE, tracking_uri=ctx.tracking_uri
                )
                summary["traces"] = log_episode_traces(ctx, step, episodes, split, eval_run, say)
                atomic_write_json(summary_file, summary)
                progress.remove_task(bar)
            summaries[step] = summary
            say(f"step {step}: pass^k {summary['pass_hat_k']} ({summary['c_over_n']} trials succeeded)")

    selection = None if not_selectable else build_selection(summaries, select_on)
    log_selection(ctx.tracking_uri, ctx.run_id, select_on, selection, not_selectable)
    ctx.results.selection = (
        None if selection is None else {"select_on": select_on, "step": selection.step, "pass^1": selection.pass_hat_1}
    )
    say(build_selection_message(selection, select_on, not_selectable))
