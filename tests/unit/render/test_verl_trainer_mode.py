"""`spec.algorithm.trainer` rendered for veRL: each mode's overrides compose against veRL 0.9.1's real Hydra config,
pass its `validate_config`, and build veRL's own trainer class for that mode (whose constructor checks the
mode's settings: separate_async's parameter_sync_step, rollout pool and checkpoint engine) with longhaul's replay
buffer for that mode."""

from __future__ import annotations

from typing import Any

import pytest

from longhaul.layout import Paths
from longhaul.render.verl import override_key, render_verl_overrides
from longhaul.spec.models import Experiment
from support.specs import spec_variant

pytestmark = pytest.mark.verl


def _render(exp: Experiment) -> list[str]:
    overrides = render_verl_overrides(exp, Paths.under("/runs/test"))
    keys = [override_key(o) for o in overrides]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    return overrides


def _trainer(cfg: Any) -> Any:
    """veRL's own trainer class for the configured mode, constructed (no Ray, no workers: `init` is not called)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    return get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)


def test_sync_is_the_default_and_keeps_longhauls_replay_buffer() -> None:
    from longhaul.agentloop.sampler import LonghaulReplayBuffer
    from support.verl_config import validate_verl

    exp = spec_variant("smoke")
    overrides = _render(exp)
    assert [o for o in overrides if o.startswith("trainer.v1.trainer_mode=")] == ["trainer.v1.trainer_mode=sync"]
    assert not [o for o in overrides if "max_off_policy" in o or "rollout_correction" in o or "hybrid_engine" in o]
    trainer = _trainer(validate_verl(overrides))
    assert type(trainer.replay_buffer) is LonghaulReplayBuffer


def test_colocate_async_renders_its_settings_and_longhauls_async_buffer() -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync

    from longhaul.agentloop.sampler import LonghaulReplayBufferAsync
    from support.verl_config import validate_verl

    exp = spec_variant(
        "smoke", algorithm__trainer={"mode": "colocate_async", "warmup_batches": 1.5, "max_staleness": 3}
    )
    cfg = validate_verl(_render(exp))
    assert cfg.trainer.v1.trainer_mode == "colocate_async"
    assert cfg.trainer.v1.colocate_async.num_warmup_batches == 1.5
    # veRL's async buffer evicts and refills failed groups itself; longhaul's subclass counts them and stops a run
    # with too many. No sync_refill_failed_groups: veRL gives custom samplers none of its built-in options, and the
    # async dataloader fetches one prompt at a time anyway.
    assert OmegaConf.to_container(cfg.trainer.v1.sampler, resolve=True) == {
        "max_off_policy_threshold": 3,
        "max_off_policy_strategy": "drop",
        "sync_refill_failed_groups": False,
        "custom_sampler": {"path": "pkg://longhaul.agentloop.sampler", "name": "LonghaulReplayBufferAsync"},
        "sampler_kwargs": {"rollout_n": exp.spec.algorithm.group_size, "max_failed_fraction": 0.5},
    }
    trainer = _trainer(cfg)
    buffer = trainer.replay_buffer
    assert type(trainer) is PPOTrainerColocateAsync and type(buffer) is LonghaulReplayBufferAsync
    assert isinstance(buffer, ReplayBufferAsync) and trainer.parameter_sync_step == 1
    assert (buffer.max_off_policy_threshold, buffer.max_off_policy_strategy) == (3, "drop")
    assert (buffer.rollout_n, buffer.max_failed_fraction) == (cfg.actor_rollout_ref.rollout.n, 0.5)
    assert buffer.refill_fn == trainer._add_prompts_to_generate  # veRL's exact refill of evicted groups


def test_unbounded_staleness_renders_null_and_wait_renders_wait() -> None:
    from support.verl_config import validate_verl

    unbounded = spec_variant("smoke", algorithm__trainer={"mode": "colocate_async", "max_staleness": None})
    assert validate_verl(_render(unbounded)).trainer.v1.sampler.max_off_policy_threshold is None
    wait = spec_variant("smoke", algorithm__trainer={"mode": "colocate_async", "stale": "wait"})
    assert _trainer(validate_verl(_render(wait))).replay_buffer.max_off_policy_strategy == "wait"


@pytest.mark.parametrize("hybrid", [False, True])
def test_separate_async_gets_its_rollout_pool_and_sync_cadence(hybrid: bool) -> None:
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    from longhaul.agentloop.sampler import LonghaulReplayBufferAsync
    from support.verl_config import validate_verl

    exp = spec_variant(
        "lata",
        resources__gpus_per_node=6,
        algorithm__train_batch_size=8,
        algorithm__ppo_mini_batch_size=4,
        algorithm__trainer={"mode": "separate_async", "rollout_gpus_per_node": 2, "hybrid_rollout": hybrid},
        policy__lora={"rank": 0},  # separate_async with LoRA is refused by the spec
    )
    cfg = validate_verl(_render(exp))
    arr = cfg.actor_rollout_ref
    assert cfg.trainer.n_gpus_per_node == 4 and arr.rollout.n_gpus_per_node == 2 and arr.rollout.nnodes == 1
    assert cfg.trainer.v1.separate_async.parameter_sync_step == 2  # 8 tasks per step / 4 per optimizer step
    assert arr.hybrid_engine is hybrid and cfg.trainer.v1.separate_async.hybrid_rollout.enable_switch is hybrid
    assert arr.rollout.checkpoint_engine.backend == "nccl"
    # veRL's constructor asserts train_batch_size == parameter_sync_step × ppo_mini_batch_size, a standalone rollout
    # pool and a non-naive checkpoint engine.
    trainer = _trainer(cfg)
    assert type(trainer) is PPOTrainerSeparateAsync and trainer.parameter_sync_step == 2
    assert trainer._enable_hybrid_replicas is hybrid
    # With the hybrid switch, veRL's constructor also checks that the buffer can wait on its depth.
    assert (
        type(trainer.replay_buffer) is LonghaulReplayBufferAsync
        and trainer.replay_buffer.rollout_n == exp.spec.algorithm.group_size
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_sampling_reaches_verls_rollout_correction(level: str) -> None:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

    from support.verl_config import validate_verl

    exp = spec_variant(
        "smoke",
        algorithm__trainer={"mode": "colocate_async", "importance_sampling": level, "importance_threshold": 3.5},
    )
    rc = validate_verl(_render(exp)).algorithm.rollout_correction
    assert rc.rollout_is == level and rc.bypass_mode is False
    assert _parse_rollout_is_threshold(rc.rollout_is_threshold) == (3.5, None)
    assert RolloutCorrectionConfig(**{k: v for k, v in rc.items() if k != "_target_"}).rollout_is == level
