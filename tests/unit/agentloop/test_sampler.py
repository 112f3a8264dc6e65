"""`LonghaulReplayBuffer` (sync) and `LonghaulReplayBufferAsync`: failed groups are dropped whole, refilled,
counted, and too many stop the run; veRL's own sampling loops run them over the in-memory TransferQueue
(`conftest.FakeTQ`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.verl


def put_group(tq, uid: str, sessions: list[bool], step: int = 3) -> None:
    """A prompt group as veRL's worker leaves it: one trajectory per finished session, then the group status."""
    tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "pending", "global_steps": step})
    for s, finished in enumerate(sessions):
        if finished:
            tq.kv_put(
                key=f"{uid}_{s}_0",
                partition_id="train",
                tag={"status": "success", "global_steps": step, "min_global_steps": 2, "max_global_steps": 2},
            )
    tq.kv_put(key=uid, partition_id="train", tag={"status": "finished" if all(sessions) else "failure"})


def make_buffer(refill_fn, mode: str = "sync", **options):
    """longhaul's buffer for `mode`, as veRL's trainer builds a custom sampler (its generic arguments only)."""
    from longhaul.agentloop.sampler import LonghaulReplayBuffer, LonghaulReplayBufferAsync

    cls = LonghaulReplayBuffer if mode == "sync" else LonghaulReplayBufferAsync
    return cls(
        trainer_mode=mode,
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs={"rollout_n": 3, **options},
        refill_fn=refill_fn,
        poll_interval=0.01,
    )


def _assert_dropped_whole_refilled_and_counted(fake_tq, mode: str):
    """With group "a" failed (one of three samples) and "b" finished: longhaul's buffer for `mode` drops "a" whole,
    refills one fresh group, trains on "b" and the refill, and counts the drop."""
    refills = []

    def refill(k):
        refills.append(k)
        put_group(fake_tq, f"r{len(refills)}", [True, True, True])
        return k

    buffer = make_buffer(refill, mode=mode)
    batch, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=2)
    assert refills == [1]
    assert sorted({k.split("_")[0] for k in batch.keys}) == ["b", "r1"] and len(batch.keys) == 6
    assert metrics["rollout/dropped_groups"] == 1 and metrics["rollout/failed_trajectories"] == 1
    assert metrics["training/rollout_failure/evicted_samples"] == 1
    assert not any(k.startswith("a") for k in fake_tq.tags["train"])  # the group and its survivors are gone
    return buffer


def test_failed_group_with_survivors_is_dropped_whole_and_refilled(fake_tq):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    put_group(fake_tq, "a", [True, False, True])  # one of three samples failed
    put_group(fake_tq, "b", [True, True, True])
    # veRL's own buffer, even with sync_refill_failed_groups, trains on the survivors of "a" (biased baseline)
    builtin = ReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        refill_fn=lambda k: k,
        gen_batch_size=1,
        sync_refill_failed_groups=True,
        train_batch_size=2,
    )
    builtin._sync_metadata_from_transfer_queue()
    assert builtin._sampleable_terminal_keys("train", builtin._terminal_eviction_reasons(3, "train")) == {"a", "b"}

    _assert_dropped_whole_refilled_and_counted(fake_tq, "sync")


def test_metrics_are_reported_when_nothing_failed(fake_tq):
    put_group(fake_tq, "a", [True, True, True])
    _, metrics = make_buffer(lambda k: pytest.fail("no refill")).sample(
        global_steps=3, partition_id="train", batch_size=1
    )
    assert metrics["rollout/dropped_groups"] == 0 and metrics["rollout/failed_trajectories"] == 0


def test_too_many_failed_groups_stop_the_run(fake_tq):
    put_group(fake_tq, "a", [False, False, False])
    fresh = iter(range(100))

    def refill(k):  # the simulator is down: every fresh prompt fails too
        put_group(fake_tq, f"r{next(fresh)}", [False, True, False])
        return k

    with pytest.raises(
        RuntimeError, match=r"3 prompt groups failed .* batch of 2 .*max_failed_fraction=0.5.* 7 trajectories"
    ):
        make_buffer(refill, max_failed_fraction=0.5).sample(global_steps=3, partition_id="train", batch_size=2)


def test_validation_groups_are_left_alone(fake_tq):
    fake_tq.kv_put(key="v", partition_id="val", tag={"is_prompt": True, "status": "failure", "global_steps": 3})
    fake_tq.kv_put(key="v_0_0", partition_id="val", tag={"status": "success"})
    batch, metrics = make_buffer(lambda k: pytest.fail("no refill")).sample(
        global_steps=3, partition_id="val", batch_size=1
    )
    assert batch.keys == ["v_0_0"] and "rollout/dropped_groups" not in metrics


@pytest.mark.parametrize(
    ("name", "mode", "options", "message"),
    [
        ("LonghaulReplayBuffer", "sync", {}, "sampler_kwargs.rollout_n: None; set it to actor_rollout_ref.rollout.n"),
        ("LonghaulReplayBuffer", "sync", {"rollout_n": 4, "max_failed": 0.2}, r"unknown keys \['max_failed'\]"),
        (
            "LonghaulReplayBuffer",
            "sync",
            {"rollout_n": 4, "max_failed_fraction": 1.5},
            "max_failed_fraction: 1.5; expected a number between 0",
        ),
        (
            "LonghaulReplayBuffer",
            "colocate_async",
            {"rollout_n": 4},
            "serves veRL's sync v1 trainer; .*'colocate_async': set .*custom_sampler.name=LonghaulReplayBufferAsync$",
        ),
        ("LonghaulReplayBufferAsync", "separate_async", {"rollout_n": 0}, "sampler_kwargs.rollout_n: 0; set it to"),
        ("LonghaulReplayBufferAsync", "colocate_async", {"rollout_n": True}, "sampler_kwargs.rollout_n: True; set it"),
        ("LonghaulReplayBufferAsync", "colocate_async", {"n": 4}, r"unknown keys \['n'\]; valid: max_failed_fraction"),
        (
            "LonghaulReplayBufferAsync",
            "colocate_async",
            {"rollout_n": 4, "max_failed_fraction": "half"},
            "max_failed_fraction: 'half'; expected a number between 0",
        ),
        (
            "LonghaulReplayBufferAsync",
            "sync",
            {"rollout_n": 4},
            r"serves veRL's async v1 trainers \(colocate_async, separate_async\); .*'sync': set "
            r".*custom_sampler.name=LonghaulReplayBuffer$",
        ),
    ],
)
def test_settings_are_checked(name, mode, options, message):
    from longhaul.agentloop import sampler

    with pytest.raises(ValueError, match=message) as refused:
        getattr(sampler, name)(
            trainer_mode=mode,
            trainer_config={},
            max_off_policy_threshold=8,
            max_off_policy_strategy="drop",
            sampler_kwargs=options,
            refill_fn=lambda k: k,
        )
    assert "\n" not in str(refused.value)  # one line


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_a_buffer_without_verls_refill_is_refused(mode):
    from longhaul.agentloop.config import sampler_name

    with pytest.raises(ValueError, match=f"^{sampler_name(mode)} needs veRL's refill_fn to replace dropped groups$"):
        make_buffer(None, mode=mode)


def test_rendered_overrides_plug_it_into_verls_trainer(fake_tq, tmp_path):
    """A shipped spec's veRL overrides plus `sampler_overrides`, composed into veRL's real Hydra config and validated
    as main_ppo validates it; veRL's trainer then builds its replay buffer (`_build_replay_buffer`) from it."""
    from pathlib import Path

    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from longhaul.agentloop.config import sampler_overrides
    from longhaul.agentloop.sampler import LonghaulReplayBuffer
    from longhaul.layout import Paths
    from longhaul.render.verl import render_verl_overrides
    from longhaul.spec import load_spec
    from support.verl_config import validate_verl

    exp = load_spec(Path(__file__).resolve().parents[3] / "specs" / "prm_lite_lata.yaml")
    rendered = render_verl_overrides(exp, Paths.under(str(tmp_path / "run")))
    keys = {o.split("=", 1)[0].lstrip("+") for o in rendered}
    cfg = validate_verl([*rendered, *(o for o in sampler_overrides(exp) if o.split("=", 1)[0].lstrip("+") not in keys)])
    trainer = PPOTrainerSync.__new__(PPOTrainerSync)
    trainer.config, trainer.trainer_mode = cfg, cfg.trainer.v1.trainer_mode
    trainer._add_prompts_to_generate = lambda k: k
    buffer = trainer._build_replay_buffer()
    assert isinstance(buffer, LonghaulReplayBuffer)
    assert (
        (buffer.rollout_n, buffer.max_failed_fraction, buffer.gen_batch_size, buffer.sync_refill_failed_groups)
        == (exp.spec.algorithm.group_size, 0.5, 1, True)
        == (cfg.actor_rollout_ref.rollout.n, 0.5, 1, True)
    )
    assert cfg.trainer.v1.sampler.sync_refill_failed_groups is True  # veRL's dataloader then fetches one prompt


def test_refill_without_single_prompt_fetches_says_what_to_set(fake_tq):
    put_group(fake_tq, "a", [False, True, True])

    def refill(k):  # what veRL's trainer raises when its dataloader fetches whole batches
        raise ValueError(f"num_prompts ({k}) must be a positive multiple of gen_batch_size (64)")

    with pytest.raises(ValueError, match="sync_refill_failed_groups=true"):
        make_buffer(refill).sample(global_steps=3, partition_id="train", batch_size=2)


# The async trainers' buffer: veRL's `ReplayBufferAsync` evicts and refills; longhaul's subclass counts and stops.


def test_async_failed_group_is_evicted_by_verl_refilled_and_counted(fake_tq):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    put_group(fake_tq, "a", [True, False, True])  # one of three samples failed
    put_group(fake_tq, "b", [True, True, True])
    # veRL's own async buffer already evicts the failed group whole (nothing to change there, only to count)
    builtin = ReplayBufferAsync(
        trainer_mode="colocate_async",
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs={},
        refill_fn=lambda k: k,
    )
    builtin._sync_metadata_from_transfer_queue()
    assert builtin._terminal_eviction_reasons(3, "train")[2] == {"a"}

    buffer = _assert_dropped_whole_refilled_and_counted(fake_tq, "colocate_async")

    # the next batch counts afresh
    put_group(fake_tq, "c", [True, True, True])
    _, metrics = buffer.sample(global_steps=4, partition_id="train", batch_size=1)
    assert metrics["rollout/dropped_groups"] == 0 and metrics["rollout/failed_trajectories"] == 0


def test_async_groups_evicted_while_separate_async_waits_are_reported_with_the_next_batch(fake_tq):
    """separate_async's hybrid switch waits through `wait_for_sampleable` before a step samples, and veRL evicts
    failed groups there too: they are counted once, with the step's batch."""
    put_group(fake_tq, "a", [False, False, True])
    put_group(fake_tq, "b", [True, True, True])
    fresh = iter(range(100))

    def refill(k):
        put_group(fake_tq, f"r{next(fresh)}", [True, True, True])
        return k

    buffer = make_buffer(refill, mode="separate_async")
    _, waited = buffer.wait_for_sampleable(global_steps=3, partition_id="train", target_count=2)
    assert waited["training/rollout_failure/evicted_samples"] == 1 and "rollout/dropped_groups" not in waited
    _, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=1)
    assert metrics["rollout/dropped_groups"] == 1 and metrics["rollout/failed_trajectories"] == 2
    _, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=1)
    assert metrics["rollout/dropped_groups"] == 0


def test_async_too_many_failed_groups_stop_the_run(fake_tq):
    put_group(fake_tq, "a", [False, False, False])
    fresh = iter(range(100))

    def refill(k):  # the simulator is down: every fresh prompt fails too
        put_group(fake_tq, f"r{next(fresh)}", [False, True, False])
        return k

    with pytest.raises(
        RuntimeError, match=r"3 prompt groups failed .* batch of 2 .*max_failed_fraction=0.5.* 7 trajectories"
    ):
        make_buffer(refill, mode="colocate_async", max_failed_fraction=0.5).sample(
            global_steps=3, partition_id="train", batch_size=2
        )


def test_async_validation_groups_are_left_alone(fake_tq):
    fake_tq.kv_put(key="v", partition_id="val", tag={"is_prompt": True, "status": "failure", "global_steps": 3})
    fake_tq.kv_put(key="v_0_0", partition_id="val", tag={"status": "success"})
    batch, metrics = make_buffer(lambda k: pytest.fail("no refill"), mode="colocate_async").sample(
        global_steps=3, partition_id="val", batch_size=1
    )
    assert batch.keys == ["v_0_0"] and "rollout/dropped_groups" not in metrics
