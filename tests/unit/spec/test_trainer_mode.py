"""`spec.algorithm.trainer`: veRL's trainer modes in the spec — each setting accepted only where its mode uses it,
separate_async only with rollout GPUs of its own, and a spec that names no mode the same run as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from longhaul.spec import SpecError, load_spec, parse_spec_text, resolved_yaml, run_name
from longhaul.spec.placement import rollout_gpu_ids, trainer_gpu_ids
from longhaul.spec.trainer_mode import TrainerMode

ROOT = Path(__file__).resolve().parents[3]


def _doc(stem: str, trainer: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "specs" / f"{stem}.yaml").read_text(encoding="utf-8"))
    if trainer is not None:
        doc["spec"]["algorithm"]["trainer"] = trainer
    for dotted, value in spec.items():
        node = doc["spec"]
        *parents, last = dotted.split("__")
        for k in parents:
            node = node.setdefault(k, {})
        node[last] = value
    return doc


def _parse(stem: str, trainer: dict[str, Any] | None, **spec: Any):
    return parse_spec_text(yaml.safe_dump(_doc(stem, trainer, **spec), sort_keys=False), file=f"{stem}.yaml")


def _problem(stem: str, trainer: dict[str, Any] | None, **spec: Any) -> tuple[str, str, int | None]:
    with pytest.raises(SpecError) as info:
        _parse(stem, trainer, **spec)
    (p,) = info.value.problems
    return p.path, p.message, p.line


def test_a_spec_without_the_section_keeps_its_run_name_and_resolved_form() -> None:
    """The section at its defaults is left out of the resolved spec (the hash's input): writing `mode: sync`
    out names the same run as saying nothing, and the resolved form reads back."""
    plain = load_spec(ROOT / "specs" / "smoke.yaml")
    explicit = _parse("smoke", {"mode": "sync", "max_staleness": 8})
    assert plain.spec.algorithm.trainer.mode == TrainerMode.SYNC
    assert run_name(explicit) == run_name(plain)
    assert "trainer" not in yaml.safe_load(resolved_yaml(plain))["spec"]["algorithm"]


def test_an_async_spec_is_another_run_and_its_resolved_form_reads_back() -> None:
    exp = _parse("smoke", {"mode": "colocate_async", "warmup_batches": 1.5, "max_staleness": 2})
    assert run_name(exp) != run_name(load_spec(ROOT / "specs" / "smoke.yaml"))
    resolved = yaml.safe_load(resolved_yaml(exp))["spec"]["algorithm"]["trainer"]
    assert resolved["mode"] == "colocate_async" and resolved["warmup_batches"] == 1.5
    back = parse_spec_text(resolved_yaml(exp), file="mounted.yaml")
    assert run_name(back) == run_name(exp) and back.spec.algorithm.trainer == exp.spec.algorithm.trainer


@pytest.mark.parametrize(
    ("trainer", "field", "fragment"),
    [
        ({"warmup_batches": 2}, "warmup_batches", "applies to the async modes only"),
        ({"max_staleness": 3}, "max_staleness", "set mode: colocate_async or separate_async"),
        ({"stale": "wait"}, "stale", "sync trains on-policy"),
        ({"mode": "colocate_async", "rollout_gpus_per_node": 1}, "rollout_gpus_per_node", "separate_async only"),
        ({"mode": "colocate_async", "hybrid_rollout": True}, "hybrid_rollout", "(mode is colocate_async)"),
        ({"mode": "colocate_async", "stale": "wait", "max_staleness": None}, "stale", "set max_staleness"),
        ({"importance_threshold": 3.0}, "importance_threshold", "importance_sampling: token or sequence"),
    ],
)
def test_a_setting_outside_its_mode_is_refused_with_the_fix(trainer: dict, field: str, fragment: str) -> None:
    path, message, line = _problem("smoke", trainer)
    assert path == f"spec.algorithm.trainer.{field}", (path, message)
    assert fragment in message and "\n" not in message
    assert line is not None


@pytest.mark.parametrize(
    ("trainer", "field"),
    [
        ({"mode": "colocate_async", "warmup_batches": float("nan")}, "warmup_batches"),
        ({"mode": "colocate_async", "warmup_batches": -1}, "warmup_batches"),
        ({"mode": "colocate_async", "warmup_batches": 1e9}, "warmup_batches"),
        ({"mode": "colocate_async", "max_staleness": 0}, "max_staleness"),
        ({"importance_sampling": "token", "importance_threshold": float("inf")}, "importance_threshold"),
        ({"importance_sampling": "token", "importance_threshold": 0.5}, "importance_threshold"),
        ({"mode": "async"}, "mode"),
    ],
)
def test_values_are_finite_and_in_range(trainer: dict, field: str) -> None:
    path, _, _ = _problem("smoke", trainer)
    assert path == f"spec.algorithm.trainer.{field}"


def test_separate_async_needs_its_rollout_gpus() -> None:
    path, message, _ = _problem("lata", {"mode": "separate_async"})
    assert path == "spec.algorithm.trainer.rollout_gpus_per_node" and "set rollout_gpus_per_node" in message


def test_separate_async_is_refused_on_the_cpu_platform() -> None:
    path, message, _ = _problem("smoke", {"mode": "separate_async", "rollout_gpus_per_node": 1})
    assert path == "spec.algorithm.trainer.mode"
    assert "use colocate_async on CPU" in message and "'naive'" in message


def test_separate_async_with_lora_is_refused() -> None:
    """veRL 0.9.1 syncs the base weights only to separate_async's standalone replicas: LoRA would never reach them."""
    layout = {"resources__gpus_per_node": 8, "user_simulator__gpu_share": "dedicated"}
    separate = {"mode": "separate_async", "rollout_gpus_per_node": 2}
    path, message, _ = _problem("lata", separate, **layout)
    assert path == "spec.algorithm.trainer.mode" and "syncs only the base weights" in message
    assert "use colocate_async, or policy.lora.rank: 0" in message
    assert _parse("lata", separate, policy__lora={"rank": 0}, **layout).spec.policy.lora.rank == 0
    assert _parse("lata", {"mode": "colocate_async"}).spec.policy.lora.rank == 16


def test_separate_async_must_leave_the_trainer_a_gpu() -> None:
    # lata: 2 GPUs per node; a dedicated TP-1 simulator would take one, the rollout the other.
    path, message, _ = _problem(
        "lata",
        {"mode": "separate_async", "rollout_gpus_per_node": 1},
        policy__lora={"rank": 0},  # separate_async with LoRA is refused (test below)
        user_simulator__gpu_share="dedicated",
        user_simulator__tensor_parallel_size=1,
    )
    assert path == "spec.algorithm.trainer.rollout_gpus_per_node" and "leaves none of the 1 GPU(s)" in message


def test_separate_async_rollout_gpus_hold_whole_engines() -> None:
    path, message, _ = _problem(
        "lata",
        {"mode": "separate_async", "rollout_gpus_per_node": 3},
        policy__lora={"rank": 0},  # separate_async with LoRA is refused (test below)
        resources__gpus_per_node=8,
        policy__rollout__tensor_parallel_size=2,
    )
    assert path == "spec.algorithm.trainer.rollout_gpus_per_node" and "multiple of" in message


def test_separate_async_syncs_every_whole_number_of_mini_batches() -> None:
    path, message, _ = _problem(
        "lata",
        {"mode": "separate_async", "rollout_gpus_per_node": 1},
        resources__gpus_per_node=4,
        algorithm__train_batch_size=4,
        algorithm__ppo_mini_batch_size=3,
        algorithm__ppo_micro_batch_size_per_gpu=1,
    )
    assert path == "spec.algorithm.ppo_mini_batch_size" and "parameter_sync_step" in message


def test_separate_async_splits_the_node_between_trainer_rollout_and_simulator() -> None:
    exp = _parse(
        "lata",
        {"mode": "separate_async", "rollout_gpus_per_node": 2},
        policy__lora={"rank": 0},  # separate_async with LoRA is refused (test below)
        resources__gpus_per_node=8,
        user_simulator__gpu_share="dedicated",
        user_simulator__tensor_parallel_size=2,
    )
    assert trainer_gpu_ids(exp) == [0, 1, 2, 3]
    assert rollout_gpu_ids(exp) == [4, 5]
    plain = _parse("lata", None)
    assert rollout_gpu_ids(plain) == [] and trainer_gpu_ids(plain) == [0, 1]


def test_the_settings_read_from_plain_yaml() -> None:
    """Every enum value survives YAML 1.1 (where a bare `off` would be the boolean false)."""
    text = (ROOT / "specs" / "smoke.yaml").read_text(encoding="utf-8")
    text = text.replace(
        "  algorithm:\n",
        "  algorithm:\n    trainer: {mode: colocate_async, stale: wait, importance_sampling: none}\n",
        1,
    )
    trainer = parse_spec_text(text, file="plain.yaml").spec.algorithm.trainer
    assert (trainer.mode, trainer.stale, trainer.importance_sampling) == ("colocate_async", "wait", "none")
