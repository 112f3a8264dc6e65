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
from longhaul.trainer.batch import TokenBatch, response_log_probs


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


def compute_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor | None,
                 advantages: torch.Tensor, response_mask: torch.Tensor, actor_cfg: Any) -> LossTerms:
    """veRL's policy loss (+ KL loss when configured) for one mini-batch (all tensors (B, T))."""
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty

    mode = actor_cfg.loss_agg_mode
    # One process holds the whole mini-batch: veRL's global normalisers are this batch's counts.
    actor_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=response_mask.sum().item(),
                                       global_batch_size=int((response_mask.sum(-1) > 0).sum().item()))
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
    """`ppo_epochs` optimizer steps on the batch (one mini-batch per step); returns veRL-named metrics."""
    model.train()
    metrics: dict[str, float] = {}
    for _ in range(actor_cfg.ppo_epochs):
        optimizer.zero_grad(set_to_none=True)
        log_prob = response_log_probs(model, batch)
        terms = compute_loss(log_prob, old_log_prob, ref_log_prob, advantages, batch.response_mask, actor_cfg)
        terms.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        metrics = {
            "actor/loss": float(terms.loss.detach()),
            "actor/pg_loss": terms.pg_loss,
            "actor/kl_loss": terms.kl_loss,
            "actor/grad_norm": float(grad_norm),
            **terms.metrics,
        }
    model.eval()
    return metrics
