"""The memory plan under veRL's trainer modes: colocate_async plans like sync (rollout on the trainer's GPUs);
separate_async names its rollout GPUs and refuses, because the plan does not model them yet."""

from __future__ import annotations

from longhaul.memory import compute_memory_plan, render_memory_plan
from longhaul.memory.shapes import builtin_shape
from support.specs import spec_variant

POLICY = builtin_shape("Qwen/Qwen2.5-7B-Instruct")
SIMULATOR = builtin_shape("Qwen/Qwen2.5-72B-Instruct-AWQ")


def test_colocate_async_plans_like_sync() -> None:
    sync = compute_memory_plan(spec_variant("lata"), POLICY, SIMULATOR)
    colocated = compute_memory_plan(
        spec_variant("lata", algorithm__trainer={"mode": "colocate_async"}), POLICY, SIMULATOR
    )
    assert colocated.issues == () and colocated.phases == sync.phases and colocated.engines == sync.engines


def test_separate_async_names_its_rollout_gpus_and_refuses() -> None:
    exp = spec_variant(
        "lata",
        resources__gpus_per_node=8,
        user_simulator__gpu_share="dedicated",
        algorithm__trainer={"mode": "separate_async", "rollout_gpus_per_node": 2},
    )
    plan = compute_memory_plan(exp, POLICY, SIMULATOR)
    header = dict(plan.header)
    assert header["rollout"].startswith("separate_async: GPUs 4-5 serve rollouts only")
    assert "trainer GPUs 0-3: no rollout replicas" in header["rollout"]
    (issue,) = plan.blocking
    assert issue.field == "spec.algorithm.trainer.mode"
    assert "does not model separate_async yet" in issue.message and "--ignore-memory-plan" in issue.hint
    text = render_memory_plan(plan)
    assert "DOES NOT FIT spec.algorithm.trainer.mode: the memory plan does not model separate_async yet" in text
    assert plan.to_dict()["issues"][0]["blocking"] is True
