"""The memory plan of an Experiment: per GPU and per phase, what each component holds (pure).

`compute_memory_plan(exp, policy, simulator)` places the components where the launch plan puts them
(`longhaul.memory.plan_layout`: the simulator's and the evaluation server's GPUs from `longhaul.render.plan`, the
trainer's dtypes from the rendered veRL overrides), estimates the trainer, and hands over to the GPU plan
(`longhaul.memory.plan_gpu`: rollout, weight sync, training and evaluation summed per GPU; separate_async's
standalone rollout GPUs and hybrid replicas in `longhaul.memory.plan_separate`) or, for a CPU spec
(`resources.gpus_per_node: 0`), to the host plan below (the trainer's host figures only). Figures are per node;
with several nodes the plan is that of the first node, which also runs the simulator.

The plan's values are in `plan_values`, its text in `plan_text`, the vLLM engines in `plan_engines` and the
actor update's rows in `plan_trainer`.
"""

from __future__ import annotations

import re

from longhaul.memory.estimate import TrainerEstimate, estimate_trainer
from longhaul.memory.plan_gpu import gpu_plan
from longhaul.memory.plan_layout import Layout, build_layout
from longhaul.memory.plan_separate import separate_phases
from longhaul.memory.plan_trainer import gc_note, plan_title, trainer_rows, training_hint
from longhaul.memory.plan_values import Issue, MemoryPlan, Phase, Row, gib
from longhaul.memory.shapes import ModelShape, format_count
from longhaul.spec.models import Experiment
from longhaul.spec.simulator import Placement
from longhaul.spec.trainer_mode import TrainerMode

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ('512Gi', '8G', '1000') in bytes."""
    m = _QUANTITY.fullmatch(quantity)
    if not m:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def compute_memory_plan(exp: Experiment, policy: ModelShape, simulator: ModelShape | None) -> MemoryPlan:
    """The memory plan of `exp` given the policy's and simulator's shapes (`simulator` may be None when the
    simulator is external: it holds no memory here)."""
    s = exp.spec
    pol, sim, alg, env = s.policy, s.user_simulator, s.algorithm, s.environment
    lay = build_layout(exp)
    cpu = lay.gpus == 0
    host_capacity = quantity_bytes(s.resources.memory)
    seq_len = env.max_prompt_tokens + env.max_response_tokens
    need_reference = alg.kl.use_kl_loss  # longhaul renders use_kl_in_reward=false
    trainer = estimate_trainer(
        policy,
        world=lay.world,
        lora_rank=pol.lora.rank,
        lora_targets=pol.lora.target_modules,
        master_size=lay.master_size,
        compute_size=lay.compute_size,
        micro_batch=alg.ppo_micro_batch_size_per_gpu,
        seq_len=seq_len,
        checkpointing=pol.gradient_checkpointing,
        eager_attention=pol.attn_implementation == "eager",
        fused_kernels=pol.use_fused_kernels,
        separate_reference=need_reference and pol.lora.rank == 0,
        reference_size=lay.reference_size,
    )
    lora = f"LoRA rank {pol.lora.rank} on {pol.lora.target_modules if isinstance(pol.lora.target_modules, str) else ','.join(pol.lora.target_modules)}"  # noqa: E501 - a string literal kept whole
    header: list[tuple[str, str]] = [
        ("policy", f"{pol.model.name}: {policy.describe()}"),
    ]
    if simulator is not None and sim.placement == Placement.COLOCATED:
        header.append(("simulator", f"{sim.model.name}: {simulator.describe()}"))
    elif sim.placement == Placement.EXTERNAL:
        header.append(("simulator", f"external at {sim.url}: no memory on this node"))
    header.append(("actor", _actor_line(exp, trainer, lora, lay)))
    if cpu:
        return _cpu_plan(exp, trainer, header, host_capacity)
    separate = alg.trainer.mode == TrainerMode.SEPARATE_ASYNC
    return gpu_plan(exp, policy, simulator, trainer, header, lay, host_capacity, separate_phases if separate else None)


def _actor_line(exp: Experiment, t: TrainerEstimate, lora: str, lay: Layout) -> str:
    pol = exp.spec.policy
    what = (
        f"{lora} ({format_count(t.trainable)} trainable of {format_count(t.total_params)})"
        if pol.lora.rank
        else f"full fine-tuning ({format_count(t.trainable)} trainable)"
    )
    precision = f"fp{8 * lay.master_size} parameters, {'bf16' if lay.compute_size == 2 else 'fp32'} compute"
    offload = (
        (
            f"param_offload {'on' if pol.param_offload else 'off'}, optimizer_offload "
            f"{'on' if pol.optimizer_offload else 'off'}"
        )
        if lay.gpus
        else "on the host (CPU run)"
    )
    ref = (
        "reference = actor with adapters off"
        if pol.lora.rank and exp.spec.algorithm.kl.use_kl_loss
        else "separate reference model (parameters on the host)"
        if t.separate_reference
        else "no reference model"
    )
    return (
        f"{what}; FSDP over {t.world} rank(s); {precision}; {offload}; {ref}; gradient checkpointing "
        f"{'on' if pol.gradient_checkpointing else 'off'}; micro-batch {t.seqs} × {t.seq_len:,} tokens "
        "(worst case: max_prompt_tokens + max_response_tokens each)"
    )


def _cpu_plan(exp: Experiment, t: TrainerEstimate, header: list[tuple[str, str]], host_capacity: int) -> MemoryPlan:
    rows = trainer_rows(t, 1, [True], exp)
    if t.separate_reference:
        rows.append(Row("reference parameters (host)", (t.reference_host,)))
    gpu_phases = tuple(
        Phase(name, title, (), 0, applies=False, reason="CPU run: resources.gpus_per_node is 0")
        for name, title in (("rollout", "rollout"), ("sync", "weight sync"), ("evaluation", "evaluation"))
    )
    training = Phase(
        "training",
        "training on the host: actor update",
        ("host",),
        host_capacity,
        tuple(rows),
        notes=(
            gc_note(exp, t, "on the host"),
            "the CPU vLLM servers (simulator, policy) hold their weights and kv_cache_memory_bytes "
            "besides; Python and Ray processes are not counted",
        ),
    )
    header.insert(
        0,
        (
            "resources",
            f"CPU run: 1 node, resources.memory {exp.spec.resources.memory} "
            f"({gib(host_capacity)} GiB); GPU phases do not apply",
        ),
    )
    issues = []
    if not training.fits:
        (total,) = training.totals()
        issues.append(
            Issue(
                "spec.resources.memory",
                f"training needs about {gib(total)} GiB of host memory, more than "
                f"resources.memory {exp.spec.resources.memory} ({gib(host_capacity)} GiB)",
                training_hint(exp, t),
            )
        )
    return MemoryPlan(
        plan_title(exp),
        tuple(header),
        (),
        (gpu_phases[0], gpu_phases[1], training, gpu_phases[2]),
        host_capacity,
        tuple(issues),
    )
