"""One GRPO update with veRL's own loss functions (policy loss, loss aggregation, KL), in one process.

This mirrors veRL's actor (`verl/workers/utils/losses.py::ppo_loss`): the PPO-clip policy loss is
`core_algos.compute_policy_loss_vanilla` aggregated with the spec's `loss_agg_mode` over the whole mini-batch
(`global_batch_info`: one process = dp_size 1, the mini-batch's token and sequence counts); the KL term is
`core_algos.kl_penalty(log_prob, ref_log_prob, type)` aggregated with the same mode and added with `kl.coef`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from longhaul.spec.models import Experiment
from longhaul.trainer.batch import TokenBatch, response_log_probs, select


def build_actor_config(exp: Experiment) -> Any:
    """veRL's ActorConfig for this spec (validates loss_agg_mode exactly as veRL's workers do)."""
    from verl.workers.config.actor import ActorConfig

    alg = exp.spec.algorithm
    return ActorConfig(
        strategy="fsdp",
        clip_ratio=alg.clip_ratio,
        loss_agg_mode=str(alg.loss_agg_mode),
        ppo_mini_batch_size=alg.ppo_mini_batch_size,
        ppo_micro_batch_size_per_gpu=alg.ppo_micro_batch_size_per_gpu,
        ppo_epochs=alg.ppo_epochs,
        use_dynamic_bsz=False,
        use_kl_loss=alg.kl.use_kl_loss,
        kl_loss_coef=alg.kl.coef,
        kl_loss_type=str(alg.kl.type),
        rollout_n=alg.group_size,
    )


@dataclass(frozen=True)
class LossTerms:
    loss: torch.Tensor
    pg_loss: float
    kl_loss: float
    metrics: dict[str, float]


def global_batch_info(response_mask: torch.Tensor) -> dict[str, Any]:
    """veRL's normalisers for a mini-batch held by one process (dp_size 1): its valid tokens and sequences."""
    return {"dp_size": 1, "batch_num_tokens": int(response_mask.sum().item()),
            "global_batch_size": int((response_mask.sum(-1) > 0).sum().item())}


def compute_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor | None,
                 advantages: torch.Tensor, response_mask: torch.Tensor, actor_cfg: Any,
                 batch_info: dict[str, Any] | None = None) -> LossTerms:
    """veRL's policy loss (+ KL loss when configured) for one micro-batch (all tensors (B, T)).

    `batch_info` holds the mini-batch's normalisers (default: this micro-batch is the mini-batch); summing the
    micro-batch losses then gives the mini-batch loss, exactly as in veRL's actor.
    """
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty

    mode = actor_cfg.loss_agg_mode
    actor_cfg.global_batch_info.clear()
    actor_cfg.global_batch_info.update(batch_info or global_batch_info(response_mask))
    pg_loss, pg_metrics = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
        loss_agg_mode=mode, config=actor_cfg,
    )
    loss = pg_loss
    kl_value = 0.0
    if actor_cfg.use_kl_loss and ref_log_prob is not None:
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=actor_cfg.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=mode, **actor_cfg.global_batch_info)
        loss = loss + actor_cfg.kl_loss_coef * kl_loss
        kl_value = float(kl_loss.detach())
    metrics = {k: float(v) for k, v in pg_metrics.items()}
    return LossTerms(loss, float(pg_loss.detach()), kl_value, metrics)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


def update_policy(model: Any, optimizer: torch.optim.Optimizer, batch: TokenBatch, old_log_prob: torch.Tensor,
                  ref_log_prob: torch.Tensor | None, advantages: torch.Tensor, actor_cfg: Any,
                  grad_clip: float = 1.0) -> dict[str, float]:
    """`ppo_epochs` optimizer steps on the mini-batch, accumulated over micro-batches; veRL-named metrics."""
    model.train()
    info = global_batch_info(batch.response_mask)
    micro = max(1, int(actor_cfg.ppo_micro_batch_size_per_gpu))
    chunks = [list(range(i, min(i + micro, batch.size))) for i in range(0, batch.size, micro)]
    metrics: dict[str, float] = {}
    for _ in range(actor_cfg.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        totals = {"actor/loss": 0.0, "actor/pg_loss": 0.0, "actor/kl_loss": 0.0}
        extra: dict[str, float] = {}
        for rows in chunks:
            sub = select(batch, rows)
            t = sub.response_mask.shape[1]
            log_prob = response_log_probs(model, sub)
            terms = compute_loss(
                log_prob, old_log_prob[rows, :t], None if ref_log_prob is None else ref_log_prob[rows, :t],
                advantages[rows, :t], sub.response_mask, actor_cfg, info,
            )
            terms.loss.backward()
            totals["actor/loss"] += float(terms.loss.detach())
            totals["actor/pg_loss"] += terms.pg_loss
            totals["actor/kl_loss"] += terms.kl_loss
            for k, v in terms.metrics.items():
                extra[k] = extra.get(k, 0.0) + v * len(rows) / batch.size
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        metrics = {**totals, "actor/grad_norm": float(grad_norm), **extra}
    model.eval()
    return metrics
