"""The vLLM engines of a GPU plan (pure): the policy's rollout engine, the evaluation server and the colocated
user simulator, each at its pre-allocated share of a GPU; how each splits its share, and whether it starts."""

from __future__ import annotations

from dataclasses import dataclass

from longhaul.memory.estimate import VLLM_SERVE_BATCHED_TOKENS, EngineEstimate, dtype_bytes, estimate_engine
from longhaul.memory.plan_values import Issue, gib
from longhaul.memory.shapes import ModelShape
from longhaul.spec.models import Experiment, Stage
from longhaul.spec.simulator import Quantization


@dataclass(frozen=True)
class Engines:
    """The engines' estimates and how the rollout engine sleeps while the trainer runs."""

    rollout: EngineEstimate
    evaluation: EngineEstimate
    simulated: EngineEstimate | None  # None: no simulator on this node's GPUs
    sleeps: bool  # policy.rollout.free_cache_engine
    level: int  # veRL's sleep level: 1 with LoRA adapters (weights to the host), 2 otherwise (weights dropped)


def estimate_engines(
    exp: Experiment, policy: ModelShape, simulator: ModelShape | None, *, colocated: bool, capacity: int
) -> Engines:
    """Estimate the engines on GPUs of `capacity` bytes; `colocated`: the simulator has GPUs on this node."""
    s = exp.spec
    pol, roll, sim = s.policy, s.policy.rollout, s.user_simulator
    pdtype = dtype_bytes(str(pol.dtype))
    # The evaluation server serves merged checkpoints (full weights, no adapter) with the rollout's engine settings.
    engine = dict(
        capacity=capacity,
        gpu_memory_utilization=roll.gpu_memory_utilization,
        tp=roll.tensor_parallel_size,
        dtype_size=pdtype,
        quantization="none",
        max_model_len=roll.max_model_len,
        max_num_seqs=roll.max_num_seqs,
        batched_tokens=roll.max_num_batched_tokens,
        enforce_eager=roll.enforce_eager,
    )
    rollout = estimate_engine(policy, **engine, lora_rank=pol.lora.rank, lora_targets=pol.lora.target_modules)
    evaluation = estimate_engine(policy, **engine)
    simulated = None
    if colocated and simulator is not None:
        quant = str(sim.quantization)
        sdtype = 2 if quant != Quantization.NONE else pdtype  # dtype "auto" = the checkpoint's 16-bit dtype
        simulated = estimate_engine(
            simulator,
            capacity=capacity,
            gpu_memory_utilization=sim.gpu_memory_utilization,
            tp=sim.tensor_parallel_size,
            dtype_size=sdtype,
            quantization=quant,
            max_model_len=sim.max_model_len,
            max_num_seqs=sim.max_num_seqs,
            batched_tokens=VLLM_SERVE_BATCHED_TOKENS,
            enforce_eager=sim.enforce_eager,
        )
    return Engines(rollout, evaluation, simulated, roll.free_cache_engine, 1 if pol.lora.rank else 2)


def describe_engines(exp: Experiment, e: Engines, capacity: int) -> list[tuple[str, str]]:
    """The plan's engine lines: each engine's share and fit (how the rollout engine sleeps depends on the trainer
    mode: `sleep_line`)."""
    s = exp.spec
    roll, sim = s.policy.rollout, s.user_simulator
    policy_share = (roll.gpu_memory_utilization, roll.tensor_parallel_size, capacity, roll.max_num_seqs)
    lines = [("policy rollout", _engine_line(e.rollout, *policy_share))]
    if Stage.EVAL in s.stages:
        lines.append(("evaluation", _engine_line(e.evaluation, *policy_share)))
    if e.simulated is not None:
        simulator_share = (sim.gpu_memory_utilization, sim.tensor_parallel_size, capacity, sim.max_num_seqs)
        lines.append(("simulator", _engine_line(e.simulated, *simulator_share)))
    return lines


def engine_issues(exp: Experiment, e: Engines) -> list[Issue]:
    """The engines that cannot start, for the stages that start them (the evaluation server shares the rollout's
    fields: reported once)."""
    stages = exp.spec.stages
    issues: list[Issue] = []
    grpo = Stage.GRPO in stages
    if grpo:
        issues += _engine_issues(e.rollout, "policy rollout engine", "spec.policy.rollout")
    if Stage.EVAL in stages and (not grpo or e.rollout.starts):  # the same fields: report once
        issues += _engine_issues(e.evaluation, "evaluation policy server", "spec.policy.rollout")
    if e.simulated is not None:
        issues += _engine_issues(e.simulated, "user simulator", "spec.user_simulator")
    return issues


def sleep_line(e: Engines) -> str:
    """How the rollout engine on the trainer's GPUs sleeps while the trainer runs, and what that frees."""
    rollout, level = e.rollout, e.level
    if not e.sleeps:
        return (
            f"off (policy.rollout.free_cache_engine: false): the engine keeps its "
            f"{gib(rollout.footprint)} per trainer GPU while the trainer runs"
        )
    freed = rollout.footprint - rollout.asleep
    moved = (
        f"weights and adapter slot {gib(rollout.weights + rollout.lora_slot)} to host RAM"
        if level == 1
        else f"weights {gib(rollout.weights)} discarded (re-sent by the weight sync)"
    )
    return (
        f"level {level} ({'LoRA adapters' if level == 1 else 'full weights'}): frees "
        f"{gib(freed)} per trainer GPU while the trainer runs (KV cache {gib(max(0, rollout.kv_cache))} "
        f"dropped, {moved}, activation pool {gib(rollout.activation_peak)} released); context and "
        f"CUDA graphs ({gib(rollout.asleep)}) stay"
    )


def _engine_line(e: EngineEstimate, gmu: float, tp: int, capacity: int, seqs: int) -> str:
    parts = f"weights {gib(e.weights)}"
    if e.lora_slot:
        parts += f", LoRA slot {gib(e.lora_slot)}"
    parts += f", activation peak {gib(e.activation_peak)}, CUDA graphs {gib(e.cuda_graphs)}, runtime {gib(e.runtime)}"
    kv = (
        f"KV cache {gib(e.kv_cache)} = {e.kv_tokens:,} tokens × {e.kv_token_bytes // 1024} KiB"
        if e.kv_cache > 0
        else f"no room for KV cache ({gib(e.kv_cache)})"
    )
    demand = f"demand {seqs} seqs × {e.max_model_len:,} = {e.demanded_tokens:,} tokens"
    if not e.starts:
        fit = f"CANNOT START: fewer than max_model_len {e.max_model_len:,} tokens"
    elif e.kv_tokens >= e.demanded_tokens:
        fit = "fits"
    else:
        fit = (
            f"holds {e.kv_tokens / e.max_model_len:.1f} full-length sequences at once "
            "(vLLM queues or preempts the rest)"
        )
    return f"TP {tp}, {gmu:.2f} × {gib(capacity)} = {gib(e.footprint)} per GPU: {parts} → {kv}; {demand}: {fit}"


def _engine_issues(e: EngineEstimate, what: str, prefix: str) -> list[Issue]:
    if e.starts:
        return []
    short = prefix.removeprefix("spec.")
    if e.kv_cache <= 0:
        return [
            Issue(
                f"{prefix}.gpu_memory_utilization",
                f"the {what}'s weights and runtime "
                f"({gib(e.weights + e.lora_slot + e.overhead)} GiB per GPU) exceed its share ({gib(e.footprint)} GiB): "
                "vLLM refuses to start",
                f"raise {short}.gpu_memory_utilization or its tensor_parallel_size",
            )
        ]
    return [
        Issue(
            f"{prefix}.max_model_len",
            f"the {what}'s KV cache holds about {e.kv_tokens:,} tokens, fewer than "
            f"max_model_len {e.max_model_len:,}: vLLM refuses to start",
            f"raise {short}.gpu_memory_utilization or lower {short}.max_model_len",
        )
    ]
