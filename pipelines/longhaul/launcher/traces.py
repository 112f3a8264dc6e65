"""Episodes as MLflow traces from inside the launcher (`longhaul.tracking.traces` builds and writes them).

- `log_episode_traces` (the eval stage, after each checkpoint's evaluation): every evaluated episode, linked to the
  step's eval run; counted as `eval/traces_logged` / `eval/traces_dropped` on that run at the step.
- `log_training_episodes` (when the grpo stage ends): every trained step's outcome metrics (`train/outcome_mean`,
  `train/reward_mean`, `train/terminations/<reason>`: the learning curve's training side), and
  `tracking.training_traces_per_step` trained episodes per step, read back from the rollout traces, linked to the
  training run with the reward they trained with; counted as `train/traces_logged` / `train/traces_dropped`.

Both are bounded (`TRACE_FLUSH_S` at most after the episodes, drops counted, never raised): a slow or absent
tracking server never fails or stalls a stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from longhaul.eval.curve import training_step_metrics
from longhaul.spec import run_name
from longhaul.tracking.traces import KIND_TRAIN, TraceLogger, build_episode_trace, prm_rule_hits, read_training_steps

if TYPE_CHECKING:
    from longhaul.launcher.context import StageContext

#: The longest a stage waits for its episode traces to reach MLflow (the rest are counted as dropped).
TRACE_FLUSH_S = 120.0


def _write(
    ctx: StageContext, link: str, traces: list[Any], prefix: str, step: int, say: Any, what: str
) -> dict[str, int]:
    """Write `traces` linked to run `link`, then log the counts as `<prefix>/traces_logged|dropped` at `step`."""
    # deferred: mlflow via tracking.runs (~1 s)
    from longhaul.tracking.runs import log_metrics

    logger = TraceLogger(ctx.tracking_uri, ctx.experiment_id, link)
    for trace in traces:
        logger.submit(trace)
    counts = logger.close(TRACE_FLUSH_S)
    try:
        log_metrics(
            ctx.tracking_uri,
            link,
            {f"{prefix}/traces_logged": counts.logged, f"{prefix}/traces_dropped": counts.dropped},
            step,
        )
    except Exception as exc:  # noqa: BLE001 - the counts are still printed (and kept in summary.json for eval)
        counts.errors.append(f"logging the counts: {type(exc).__name__}: {exc}")
    say(
        f"{what}: {counts.logged} episode trace(s) in MLflow, {counts.dropped} dropped"
        + (f" ({counts.errors[0]})" if counts.errors else "")
    )
    return {"logged": counts.logged, "dropped": counts.dropped}


def _tracked(ctx: StageContext) -> bool:
    return bool(ctx.tracking_uri and ctx.experiment_id)


def log_episode_traces(
    ctx: StageContext, step: int, episodes: list[Any], split: Any, eval_run: str | None, say: Any
) -> dict[str, int]:
    """Every evaluated episode of `step` (`Trajectory` objects) as an MLflow trace, linked to the step's eval run
    (the training run when the relay creates the eval run later)."""
    if not _tracked(ctx) or not episodes:
        return {"logged": 0, "dropped": 0}
    alg, rules = ctx.exp.spec.algorithm, ctx.exp.spec.reward.rules.overrides()
    link = eval_run or ctx.run_id
    traces = []
    for traj in episodes:
        rec = traj.to_dict()
        hits, process = prm_rule_hits(rec, rules, seed_compat=bool(alg.seed_compat))
        traces.append(
            build_episode_trace(
                rec,
                run_name=run_name(ctx.exp),
                step=step,
                run_id=link,
                subset=split.primary(traj.task_id),
                rule_hits=hits,
                process=process,
            )
        )
    return _write(ctx, link, traces, "eval", step, say, f"step {step}")


def log_training_episodes(ctx: StageContext, rollouts_dir: str, say: Any) -> dict[str, int]:
    """When the grpo stage ends, in one pass over the rollout traces: every trained step's metrics
    (`longhaul.eval.curve.training_step_metrics`: mean reward and outcome, terminations) logged on the training run
    at that step, and a sample of each step's episodes (`tracking.training_traces_per_step`) as MLflow traces
    linked to it (the trace counts are logged at the last sampled step). Returns the trace counts."""
    # deferred: mlflow via tracking.runs (~1 s)
    from longhaul.tracking.runs import log_metrics

    none = {"logged": 0, "dropped": 0}
    if not _tracked(ctx):
        return none
    per_step = ctx.exp.spec.tracking.training_traces_per_step
    alg, rules = ctx.exp.spec.algorithm, ctx.exp.spec.reward.rules.overrides()
    traces, last_sampled, unlogged = [], None, []
    try:
        for step, lines in read_training_steps(rollouts_dir):
            if not lines:
                continue
            try:
                log_metrics(ctx.tracking_uri, ctx.run_id, training_step_metrics(lines), step)
            except Exception as exc:  # noqa: BLE001 - a failing tracking server never fails a finished stage
                if not unlogged:
                    say(f"training episodes: step metrics not logged ({type(exc).__name__}: {exc})")
                unlogged.append(step)
            for line in lines[: max(0, per_step)]:
                rec = line["trajectory"]
                hits, process = prm_rule_hits(rec, rules, seed_compat=bool(alg.seed_compat))
                trained = line.get("reward") or {}  # what the episode trained with (the agent loop's record)
                score = trained.get("score")
                traces.append(
                    build_episode_trace(
                        rec,
                        run_name=run_name(ctx.exp),
                        step=step,
                        run_id=ctx.run_id,
                        subset="train",
                        rule_hits=hits,
                        process=trained.get("process", process),
                        kind=KIND_TRAIN,
                        reward=score if isinstance(score, int | float) else None,
                    )
                )
                last_sampled = step
    except (OSError, ValueError) as exc:  # unreadable rollout traces: say so, training itself is done
        say(f"training episodes: rollout traces unreadable ({exc}); nothing more logged")
        return none
    if not traces or last_sampled is None:
        return none
    return _write(ctx, ctx.run_id, traces, "train", last_sampled, say, "training traces")
