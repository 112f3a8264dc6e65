"""The memory plan under veRL's trainer modes: colocate_async plans like sync (rollout on the trainer's GPUs);
separate_async puts standalone rollout replicas on GPUs of their own, the trainer's state on the rest, and with
hybrid_rollout rollout replicas on the trainer's GPUs too."""

from __future__ import annotations

from longhaul.memory import compute_memory_plan, render_memory_plan
from longhaul.memory.gpus import GiB
from longhaul.memory.shapes import builtin_shape
from longhaul.memory.sync_nccl import estimate_checkpoint_sync
from support.memory_plans import plan_phase, plan_row
from support.specs import spec_variant

POLICY = builtin_shape("Qwen/Qwen2.5-7B-Instruct")
SIMULATOR = builtin_shape("Qwen/Qwen2.5-72B-Instruct-AWQ")
TRAINER, ROLLOUT, SIM = (0, 1, 2, 3), (4, 5), (6, 7)


def _separate(hybrid: bool, **changes: object):
    """lata on 8 GPUs: the trainer on 0-3, the standalone rollout replicas on 4-5, the simulator on 6-7."""
    return spec_variant(
        "lata",
        resources__gpus_per_node=8,
        user_simulator__gpu_share="dedicated",
        algorithm__trainer={"mode": "separate_async", "rollout_gpus_per_node": 2, "hybrid_rollout": hybrid},
        **{"policy__lora": {"rank": 0}, **changes},  # separate_async with LoRA is refused by the spec
    )


def _on(row, ids) -> tuple[int, ...]:
    return tuple(row.values[i] for i in ids)


def test_colocate_async_plans_like_sync() -> None:
    sync = compute_memory_plan(spec_variant("lata"), POLICY, SIMULATOR)
    colocated = compute_memory_plan(
        spec_variant("lata", algorithm__trainer={"mode": "colocate_async"}), POLICY, SIMULATOR
    )
    assert colocated.issues == () and colocated.phases == sync.phases and colocated.engines == sync.engines


def test_separate_async_rollout_gpus_hold_the_engine_and_the_trainer_gpus_the_trainer() -> None:
    exp = _separate(hybrid=False)
    plan = compute_memory_plan(exp, POLICY, SIMULATOR)
    assert plan.issues == (), [i.render() for i in plan.issues]
    assert [p.name for p in plan.phases] == ["rollout", "sync", "training", "evaluation"]
    header = dict(plan.header)
    assert header["rollout"].startswith("separate_async: GPUs 4-5 serve rollouts only, 2 standalone vLLM replica(s)")
    assert header["rollout"].endswith("trainer GPUs 0-3: no rollout replicas")
    assert "trainer (FSDP, 4 rank(s)) on GPUs 0-3; standalone policy rollout replicas on GPUs 4-5" in header["layout"]
    share = int(exp.spec.policy.rollout.gpu_memory_utilization * 80 * GiB)
    rollout, sync, training = (plan_phase(plan, n) for n in ("rollout", "sync", "training"))
    for phase in (rollout, training):  # the standalone replicas generate throughout
        engine = plan_row(phase, "policy rollout vLLM (standalone)")
        assert _on(engine, ROLLOUT) == (share, share) and set(_on(engine, TRAINER + SIM)) == {0}
        assert set(_on(plan_row(phase, "checkpoint-engine worker"), ROLLOUT)) == {GiB // 2 + GiB // 4}
        # no rollout engine on the trainer's GPUs, no trainer state on the rollout GPUs
        engines = [r for r in phase.rows if "vLLM" in r.label and not r.label.startswith("user simulator")]
        assert all(set(_on(r, TRAINER)) == {0} for r in engines), [r.label for r in engines]
        trainer = [r for r in phase.rows if r.label.startswith(("actor", "trainer", "checkpoint-engine NCCL"))]
        assert trainer and all(set(_on(r, ROLLOUT)) == {0} for r in trainer)
    params = plan_row(training, "actor parameters")
    assert set(_on(params, TRAINER)) == {params.values[0]} and params.values[0] > 0
    # The sync: the replicas keep their weights (their KV cache is freed) and receive through three buckets.
    kept = plan_row(sync, "policy vLLM (standalone) weights")
    assert 14 * GiB < kept.values[4] < share
    assert plan_row(sync, "checkpoint-engine receive buffers").values[4] == 4 * GiB
    assert plan_row(sync, "bucket to the vLLM worker").values[4] == 2 * GiB
    assert plan_row(sync, "checkpoint-engine send/receive buffers").values[0] == 4 * GiB
    assert sync.host > training.host > 0  # π_old's copy on the host
    text = render_memory_plan(plan)
    assert "weight sync: trainer → standalone replicas (NCCL checkpoint engine)" in text
    assert "standalone replicas never sleep" in dict(plan.engines)["sleep"]
    assert "DOES NOT FIT" not in text and "does not model" not in text


def test_separate_async_with_hybrid_rollout_lends_the_trainer_gpus() -> None:
    plan = compute_memory_plan(_separate(hybrid=True), POLICY, SIMULATOR)
    assert plan.issues == (), [i.render() for i in plan.issues]
    assert [p.name for p in plan.phases] == ["rollout", "sync", "hybrid_sync", "training", "evaluation"]
    assert dict(plan.header)["rollout"].endswith(
        "trainer GPUs 0-3: 4 hybrid replica(s) of TP 1, lent to rollouts while the trainer waits"
    )
    rollout, sync, hybrid_sync, training = (plan_phase(plan, n) for n in ("rollout", "sync", "hybrid_sync", "training"))
    hybrid = plan_row(rollout, "policy rollout vLLM (hybrid)")
    standalone = plan_row(rollout, "policy rollout vLLM (standalone)")
    assert _on(hybrid, TRAINER) == (standalone.values[4],) * 4 and set(_on(hybrid, ROLLOUT)) == {0}
    # The hybrid replicas sleep (level 2, full weights) while the trainer works and while it syncs the standalone
    # ones.
    for phase in (sync, training):
        asleep = plan_row(phase, "policy vLLM (hybrid) asleep (level 2")
        assert 0 < asleep.values[0] < 2 * GiB and set(_on(asleep, ROLLOUT)) == {0}
    # Their own (colocated) sync wakes their weights on the trainer GPUs while the standalone replicas generate.
    woken = plan_row(hybrid_sync, "policy vLLM weights woken")
    assert woken.values[0] > 14 * GiB and set(_on(woken, ROLLOUT)) == {0}
    assert _on(plan_row(hybrid_sync, "policy rollout vLLM (standalone)"), ROLLOUT) == _on(standalone, ROLLOUT)
    assert "hybrid replicas: level 2 (full weights)" in dict(plan.engines)["sleep"]


def test_a_separate_async_layout_too_small_for_the_trainer_gets_the_phase_issue() -> None:
    exp = spec_variant(
        "prm_lite_lata",
        algorithm__trainer={"mode": "separate_async", "rollout_gpus_per_node": 1},
        policy__lora={"rank": 0},
    )
    plan = compute_memory_plan(exp, POLICY, SIMULATOR)
    (issue,) = plan.blocking
    assert issue.field == "spec.algorithm.ppo_micro_batch_size_per_gpu"
    assert issue.message.startswith("the training phase needs more than the 80.00 GiB of a GPU (GPU 0: ")
    assert "lower algorithm.ppo_micro_batch_size_per_gpu" in issue.hint
    assert plan_phase(plan, "training").verdicts()[0] == "OVER"


def test_a_rollout_gpu_over_capacity_in_the_sync_names_free_cache_engine() -> None:
    exp = _separate(hybrid=False, policy__rollout={"gpu_memory_utilization": 0.9, "free_cache_engine": False})
    plan = compute_memory_plan(exp, POLICY, SIMULATOR)
    (issue,) = plan.blocking
    assert issue.field == "spec.policy.rollout.free_cache_engine"
    assert "the sync phase needs more than the 80.00 GiB of a rollout GPU (GPU 4: " in issue.message
    assert "GPU 0" not in issue.message and "turn on policy.rollout.free_cache_engine" in issue.hint
    assert plan_phase(plan, "rollout").fits  # the replicas' share fits; the sync's buffers come on top


def test_the_checkpoint_sync_doubles_the_bucket_and_reassembles_large_tensors() -> None:
    shards = POLICY.total_params() * 4 // 4
    sync = estimate_checkpoint_sync(POLICY, world=4, master_size=4, shards=shards, param_offload=True, bucket=2 * GiB)
    embedding = POLICY.vocab_size * POLICY.hidden_size * 4  # fp32, larger than the bucket
    assert dict(sync.receiver) == {
        "checkpoint-engine receive buffers (2 × 2048 MiB)": 4 * GiB,
        "bucket to the vLLM worker (2048 MiB)": 2 * GiB,
        "largest tensor reassembled from chunks (fp32)": embedding,
    }
    assert dict(sync.sender.peak.rows)["checkpoint-engine send/receive buffers (2 × 2048 MiB)"] == 4 * GiB
    assert sync.sender.host_base == 0  # full fine-tuning: no base model gathered on the host
