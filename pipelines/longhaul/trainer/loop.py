"""The single-process GRPO loop (CPU): rollouts → rewards → advantages → veRL-loss update → checkpoint → serve.

Runs inside the launcher (`IN_PROCESS_STAGES`), which owns the servers and the signal handling:

* every step: `train_batch_size` training tasks × `group_size` episodes through the shared episode runner
  against the policy server (current weights) and the user simulator; outcome + PRM-Lite reward; the spec's
  advantage estimator (`longhaul.algos`); group-saturation diagnostics; one update per mini-batch with veRL's
  loss functions; a checkpoint every `save_freq` steps (and at the end); the policy server then serves the new
  weights (in-place reload, or restart — measured as `timing/serve_weights_s`);
* resume: the newest complete checkpoint is loaded (model, optimizer, step) and served, and training continues
  into the same MLflow run;
* SIGUSR1: the rollout in flight is abandoned, the current weights are saved as a checkpoint (if not saved
  already) and `RequeueRequested` ends the stage; SIGTERM/Ctrl-C: `StopRequested`, nothing new is written.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from longhaul.launcher.control import RequeueRequested, StopRequested
from longhaul.trainer.batch import (
    EpisodeTokens,
    TokenBatch,
    build_episode_tokens,
    collate,
    response_log_probs,
    select,
)
from longhaul.trainer.checkpoint import MODEL_SUBDIR, latest_step, load_state, save_checkpoint, step_dir
from longhaul.trainer.rollout import EpisodeJob, RolloutStopped, run_episodes
from longhaul.trainer.stats import compute_zero_signal_fraction, summarize
from longhaul.trainer.update import build_actor_config, masked_mean, update_policy


def batch_log_probs(model: Any, batch: TokenBatch, micro: int) -> torch.Tensor:
    """Response log-probs of a whole batch without gradients, micro-batch by micro-batch."""
    t = batch.response_mask.shape[1]
    out = torch.zeros(batch.response_mask.shape)
    with torch.no_grad():
        for i in range(0, batch.size, micro):
            rows = list(range(i, min(i + micro, batch.size)))
            lp = response_log_probs(model, select(batch, rows))
            out[rows, : lp.shape[1]] = lp
    return out[:, :t]


def step_tasks(train_ids: list[str], step: int, per_step: int, seed: int) -> list[str]:
    """Tasks of training step `step` (1-based): epochs over a seeded shuffle of the training tasks."""
    out = []
    for j in range((step - 1) * per_step, step * per_step):
        epoch, pos = divmod(j, len(train_ids))
        order = list(train_ids)
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(order[pos])
    return out


def _load_policy(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tok


def run_training_stage(ctx: Any) -> None:
    """The `grpo` stage with `algorithm.trainer: single_process` (see the module docstring)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from longhaul.algos.diagnostics import compute_group_saturation
    from longhaul.algos.estimators import compute_advantages
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.runner import EpisodeLimits, tool_schemas
    from longhaul.rewards.combine import build_token_rewards, combine_reward
    from longhaul.rewards.prm_lite import build_rule_params, score_trajectory
    from longhaul.tracking.runs import log_checkpoint, log_metrics

    exp, control = ctx.exp, ctx.control
    spec = exp.spec
    alg, env_spec = spec.algorithm, spec.environment
    say = lambda m: print(f"[trainer] {m}", file=ctx.echo, flush=True)  # noqa: E731
    ckpt_dir = ctx.checkpoint_dir
    torch.manual_seed(alg.seed)
    random.seed(alg.seed)

    base_path = Path(spec.policy.model.path or spec.policy.model.name)
    start = latest_step(ckpt_dir) or 0
    model_path = step_dir(ckpt_dir, start) / MODEL_SUBDIR if start else base_path
    model, tokenizer = _load_policy(model_path)
    ref_model = None
    if alg.kl.use_kl_loss:
        ref_model, _ = _load_policy(base_path)
    actor_cfg = build_actor_config(exp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=alg.learning_rate, weight_decay=0.0)
    if start:
        opt_file = step_dir(ckpt_dir, start) / "optimizer.pt"
        if opt_file.is_file():
            optimizer.load_state_dict(torch.load(opt_file, weights_only=True))
        say(f"resuming from checkpoint global_step_{start} (state {load_state(ckpt_dir, start)})")
    rows: list[dict[str, Any]] = ctx.results.setdefault("train_rows", [])
    if start >= alg.total_steps:
        say(f"already trained to step {start} of {alg.total_steps}")
        return

    policy = ctx.policy_server()
    if start:
        took = policy.serve_weights(model_path, f"step {start}", abort=lambda: control.requested)
        say(f"policy server serves global_step_{start} ({took:.1f} s)")
    limits = EpisodeLimits.from_spec(exp)
    split = build_split(env_spec.split)
    tools = tool_schemas()
    process = str(spec.reward.process) != "none"
    rule_params = build_rule_params(spec.reward.rules) if process else None
    micro = max(1, alg.ppo_micro_batch_size_per_gpu)
    saved_at = start

    def save(step: int, extra: dict[str, Any]) -> None:
        nonlocal saved_at
        d = save_checkpoint(ckpt_dir, step, model, tokenizer, optimizer, {"seed": alg.seed, **extra})
        log_checkpoint(ctx.tracking_uri, ctx.run_id, step, d.absolute().as_uri())
        saved_at = step
        say(f"checkpoint {d}")

    def requeue(step_done: int) -> None:
        if saved_at < step_done:
            save(step_done, {"reason": "SIGUSR1"})
        raise RequeueRequested(f"grpo step {step_done + 1}")

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        transient=False)
    with progress:
        steps_bar = progress.add_task("training steps", total=alg.total_steps, completed=start)
        for step in range(start + 1, alg.total_steps + 1):
            control.check()
            if control.checkpoint.is_set():
                requeue(step - 1)
            t_step = time.monotonic()
            task_ids = step_tasks(split.train, step, alg.train_batch_size, alg.seed)
            jobs = [EpisodeJob(t, k, alg.seed * 100_000 + step * 1_000 + g * alg.group_size + k)
                    for g, t in enumerate(task_ids) for k in range(alg.group_size)]
            bar = progress.add_task(f"step {step} rollouts", total=len(jobs))
            try:
                trajs = run_episodes(
                    jobs, policy_url=policy.base_url, policy_model=policy.served_model_name,
                    policy_sampling=spec.policy.rollout.train, simulator_url=ctx.simulator_base_url,
                    simulator_model=ctx.simulator_model, simulator_sampling=spec.user_simulator.sampling,
                    limits=limits, concurrency=spec.evaluation.concurrency, should_stop=lambda: control.requested,
                    on_done=lambda _t, b=bar: progress.advance(b),
                )
            except RolloutStopped:
                control.check()
                requeue(step - 1)
            t_roll = time.monotonic() - t_step
            _save_rollouts(Path(ctx.plan.paths.data_dir) / "rollouts" / f"step_{step}.jsonl", trajs)

            # Rewards (outcome + PRM-Lite) and tokens of every episode.
            kept_jobs, episodes, token_rows, scores, outcomes, processes, turns = [], [], [], [], [], [], []
            dropped = 0
            for job, traj in zip(jobs, trajs, strict=True):
                ep = build_episode_tokens(tokenizer, traj.messages, tools, env_spec.max_prompt_tokens +
                                          env_spec.max_response_tokens + 8192)
                if not isinstance(ep, EpisodeTokens):
                    dropped += 1
                    continue
                prm = score_trajectory(traj, rule_params, seed_compat=alg.seed_compat) if process else None
                rb = combine_reward(traj.outcome, prm, spec.reward.weight)
                kept_jobs.append(job)
                episodes.append(ep)
                token_rows.append(build_token_rewards(rb, ep.response_mask, str(spec.reward.credit)))
                scores.append(rb.score)
                outcomes.append(rb.outcome)
                processes.append(rb.process)
                turns.append(len(traj.turns))
            if not episodes:
                raise RuntimeError(f"step {step}: none of the {len(trajs)} episodes could be tokenized for the update")
            batch = collate(episodes, tokenizer.pad_token_id)
            rewards = torch.zeros(batch.response_mask.shape)
            for i, row in enumerate(token_rows):
                rewards[i, : len(row)] = torch.tensor(row)
            adv, _ = compute_advantages(
                rewards, batch.response_mask, [j.task_id for j in kept_jobs], advantage=str(alg.advantage),
                alpha=alg.alpha, discount_unit=str(alg.discount_unit), length_exponent=alg.length_exponent,
                seed_compat=alg.seed_compat, credit=str(spec.reward.credit), norm_by_std=alg.norm_adv_by_std,
            )

            control.check()
            t_upd = time.monotonic()
            old_lp = batch_log_probs(model, batch, micro)
            # Until the first update the policy is the reference model: same log-probs, one forward pass saved.
            ref_lp = None if ref_model is None else (old_lp if step == 1 else batch_log_probs(ref_model, batch, micro))
            upd = update_policy(model, optimizer, batch, old_lp, ref_lp, adv.float(), actor_cfg)
            new_lp = batch_log_probs(model, batch, micro)
            t_upd = time.monotonic() - t_upd
            m = batch.response_mask
            before, after = masked_mean(old_lp, m), masked_mean(new_lp, m)
            pos = (adv.sum(1) > 0).float().unsqueeze(1) * m
            metrics: dict[str, float] = {
                **upd,
                **summarize(scores, "reward"),
                **summarize(outcomes, "reward/outcome"),
                **summarize(processes, "reward/process"),
                **summarize([float(e.num_policy_tokens) for e in episodes], "response_length"),
                **summarize([float(len(e.response_ids)) for e in episodes], "response_length/all_tokens"),
                **summarize([float(t) for t in turns], "num_turns"),
                **compute_group_saturation(outcomes, [j.task_id for j in kept_jobs], scores,
                                           processes if process else None),
                "train/saturated_group_fraction": compute_zero_signal_fraction([j.task_id for j in kept_jobs], scores),
                "critic/advantages/max": float(adv.max()),
                "critic/advantages/min": float(adv.min()),
                "policy/logprob_before": before,
                "policy/logprob_after": after,
                "policy/logprob_delta": after - before,
                "policy/logprob_delta_positive_adv": masked_mean(new_lp - old_lp, pos) if pos.sum() > 0 else 0.0,
                "train/episodes": float(len(trajs)),
                "train/episodes_dropped": float(dropped),
                "timing/rollout_s": t_roll,
                "timing/update_s": t_upd,
            }
            save_now = step % alg.save_freq == 0 or step == alg.total_steps or control.checkpoint.is_set()
            if save_now:
                save(step, {"logprob_after": after})
            if step < alg.total_steps and not control.requested:
                metrics["timing/serve_weights_s"] = policy.serve_weights(
                    step_dir(ckpt_dir, step) / MODEL_SUBDIR if saved_at == step else _export(model, tokenizer, ckpt_dir),
                    f"step {step}", abort=lambda: control.requested)
            metrics["timing/step_s"] = time.monotonic() - t_step
            log_metrics(ctx.tracking_uri, ctx.run_id, metrics, step)
            rows.append({"step": step, "reward": metrics["reward/mean"], "outcome": metrics["reward/outcome/mean"],
                         "saturated": metrics["train/saturated_group_fraction"], "loss": metrics["actor/loss"],
                         "logprob_before": before, "logprob_after": after,
                         "resp_len": metrics["response_length/mean"], "serve_s": metrics.get("timing/serve_weights_s"),
                         "step_s": metrics["timing/step_s"]})
            say(f"step {step}: reward {metrics['reward/mean']:.3f}, loss {metrics['actor/loss']:.4f}, "
                f"log-prob of sampled actions {before:.4f} → {after:.4f}")
            progress.advance(steps_bar)
            progress.remove_task(bar)
            control.check()
            if control.checkpoint.is_set():
                requeue(step)


def _save_rollouts(path: Path, trajs: list[Any]) -> None:
    """The step's episodes (transcripts, turns, grades) as JSONL, written atomically."""
    import json

    from longhaul.launcher.files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(t.to_dict(), default=str) + "\n" for t in trajs))


def _export(model: Any, tokenizer: Any, ckpt_dir: Path) -> Path:
    """Weights between checkpoints (save_freq > 1) go to a scratch model directory for the server."""
    out = Path(ckpt_dir).parent / "serving" / "policy"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


__all__ = ["StopRequested", "run_training_stage", "step_tasks"]
