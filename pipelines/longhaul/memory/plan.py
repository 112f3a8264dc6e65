"""The memory plan of an Experiment: per GPU and per phase, what each component holds (pure).

`compute_memory_plan(exp, policy, simulator)` places the components where the launch plan puts them (the
simulator's and the evaluation server's GPUs come from `longhaul.render.plan`, the trainer's dtypes from the
rendered veRL overrides) and sums them per phase:

- rollout: the simulator and the policy's rollout engine at their pre-allocated shares, the trainer process
  with whatever `param_offload` / `optimizer_offload` leave on the GPU;
- weight sync: training → rollout; the engine's weights are woken (KV cache still freed) while the actor's
  parameters are on the GPU for the export;
- training: the simulator, the sleeping engine's remainder, and the actor update (parameters, gradients,
  optimizer states, FSDP all-gather, activations, logits);
- evaluation: the simulator and the evaluation policy server.

A CPU spec (`resources.gpus_per_node: 0`) gets the trainer's host figures only. Figures are per node; with
several nodes the plan is that of the first node, which also runs the simulator.

Size: over 400 lines because the formulas of every component and phase form one table, checked together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from longhaul import constants as C
from longhaul.layout import Paths
from longhaul.memory.estimate import (
    CUDA_CONTEXT,
    NCCL_BUFFERS,
    TIGHT_FRACTION,
    VLLM_SERVE_BATCHED_TOKENS,
    EngineEstimate,
    TrainerEstimate,
    dtype_bytes,
    estimate_engine,
    estimate_trainer,
)
from longhaul.memory.gpus import GiB, gpu_capacity
from longhaul.memory.shapes import ModelShape, format_count
from longhaul.memory.sync import estimate_sync
from longhaul.render.plan import render_policy_server, render_simulator_server
from longhaul.render.verl import render_verl_overrides
from longhaul.spec.models import Experiment, GpuShare, Placement, Quantization, Stage
from longhaul.spec.naming import run_name
from longhaul.spec.placement import trainer_gpu_ids

#: veRL 0.9.1 defaults the plan relies on when the rendered overrides do not set them (trainer/config/engine/fsdp.yaml;
#: the weight-sync bucket and the rollout's load format: trainer/config/rollout/rollout.yaml).
VERL_MODEL_DTYPE = "fp32"
VERL_COMPUTE_DTYPE = "bfloat16"
VERL_BUCKET_MEGABYTES = "2048"
VERL_LOAD_FORMAT = "dummy"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ('512Gi', '8G', '1000') in bytes."""
    m = _QUANTITY.fullmatch(quantity)
    if not m:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def gib(n: float) -> str:
    return f"{n / GiB:.2f}"


# ---------------------------------------------------------------------------------------------------------
# Plan values


@dataclass(frozen=True)
class Row:
    """One component: bytes per column (GPU or host). `counted=False` rows explain and are not summed."""

    label: str
    values: tuple[int, ...]
    counted: bool = True


@dataclass(frozen=True)
class Issue:
    """A finding with the field to change. `blocking`: a phase over capacity or an engine that cannot start."""

    field: str
    message: str
    hint: str
    blocking: bool = True

    def render(self) -> str:
        return f"{self.field}: {self.message}; {self.hint}"


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    columns: tuple[str, ...]  # "GPU 0", …, or "host"
    capacity: int  # per column
    rows: tuple[Row, ...] = ()
    applies: bool = True
    reason: str = ""  # why it does not apply
    host: int | None = None  # node host RAM in this phase (GPU specs)
    notes: tuple[str, ...] = ()

    def totals(self) -> tuple[int, ...]:
        return tuple(sum(r.values[i] for r in self.rows if r.counted) for i in range(len(self.columns)))

    def verdicts(self) -> tuple[str, ...]:
        return tuple(verdict(total, self.capacity) for total in self.totals())

    @property
    def fits(self) -> bool:
        return not self.applies or all(t <= self.capacity for t in self.totals())


def verdict(total: int, capacity: int) -> str:
    if total > capacity:
        return "OVER"
    return "tight" if capacity - total < TIGHT_FRACTION * capacity else "fits"


@dataclass(frozen=True)
class MemoryPlan:
    title: str
    header: tuple[tuple[str, str], ...]
    engines: tuple[tuple[str, str], ...]
    phases: tuple[Phase, ...]
    host_capacity: int
    issues: tuple[Issue, ...] = field(default=())

    @property
    def blocking(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.blocking)

    @property
    def warnings(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if not i.blocking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "header": dict(self.header),
            "engines": dict(self.engines),
            "host_capacity_bytes": self.host_capacity,
            "phases": [
                {
                    "name": p.name,
                    "title": p.title,
                    "applies": p.applies,
                    "reason": p.reason,
                    "columns": list(p.columns),
                    "capacity_bytes": p.capacity,
                    "host_bytes": p.host,
                    "notes": list(p.notes),
                    "rows": [{"label": r.label, "bytes": list(r.values), "counted": r.counted} for r in p.rows],
                    "total_bytes": list(p.totals()) if p.applies else [],
                    "verdict": list(p.verdicts()) if p.applies else [],
                }
                for p in self.phases
            ],
            "issues": [
                {"field": i.field, "message": i.message, "hint": i.hint, "blocking": i.blocking} for i in self.issues
            ],
        }


# ---------------------------------------------------------------------------------------------------------
# Settings the plan reads from the launch plan and the rendered veRL overrides (one fact, one place)


def _visible(env: dict[str, str]) -> list[int]:
    devices = env.get(C.CUDA_MASK_VAR, "")  # positions in the job's mask
    return [int(d) for d in devices.split(",") if d.strip()]


def _override(overrides: list[str], key: str, default: str) -> str:
    for o in overrides:
        if o.startswith(key + "="):
            return o.split("=", 1)[1]
    return default


@dataclass(frozen=True)
class _Layout:
    gpus: int
    trainer: tuple[int, ...]
    simulator: tuple[int, ...]
    evaluation: tuple[int, ...]
    world: int
    master_size: int
    compute_size: int
    reference_size: int
    bucket: int  # the weight sync's bucket in bytes
    base_sync: bool  # the first sync sends the base weights too (LoRA on an engine started on dummy weights)


def _layout(exp: Experiment) -> _Layout:
    s = exp.spec
    overrides = render_verl_overrides(exp, Paths.under("run"))
    actor = "actor_rollout_ref.actor.fsdp_config"
    master = _override(overrides, f"{actor}.model_dtype", VERL_MODEL_DTYPE)
    compute = _override(overrides, f"{actor}.dtype", VERL_COMPUTE_DTYPE)
    reference = _override(overrides, "actor_rollout_ref.ref.fsdp_config.model_dtype", VERL_MODEL_DTYPE)
    rollout = "actor_rollout_ref.rollout"
    bucket_mb = _override(
        overrides, f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes", VERL_BUCKET_MEGABYTES
    )
    # veRL: `base_sync_done = "dummy" not in rollout.load_format` (workers/engine_workers.py)
    dummy = "dummy" in _override(overrides, f"{rollout}.load_format", VERL_LOAD_FORMAT)
    cpu = s.resources.gpus_per_node == 0
    trainer = () if cpu else tuple(trainer_gpu_ids(exp))
    sim_server = render_simulator_server(exp)
    simulator = () if cpu or sim_server is None else tuple(_visible(dict(sim_server.env)))
    evaluation = () if cpu else tuple(_visible(dict(render_policy_server(exp).env)))
    world = 1 if cpu else len(trainer) * s.resources.nodes
    return _Layout(
        s.resources.gpus_per_node,
        trainer,
        simulator,
        evaluation,
        world,
        dtype_bytes(master),
        dtype_bytes(compute),
        dtype_bytes(reference),
        int(bucket_mb) << 20,
        dummy and s.policy.lora.rank > 0,
    )


def _span(ids: tuple[int, ...] | list[int]) -> str:
    """'GPU 0', 'GPUs 0-3', 'GPUs 0,2'."""
    ids = sorted(ids)
    if len(ids) == 1:
        return f"GPU {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"GPUs {ids[0]}-{ids[-1]}"
    return "GPUs " + ",".join(str(i) for i in ids)


# ---------------------------------------------------------------------------------------------------------
# The plan


def compute_memory_plan(exp: Experiment, policy: ModelShape, simulator: ModelShape | None) -> MemoryPlan:
    """The memory plan of `exp` given the policy's and simulator's shapes (`simulator` may be None when the
    simulator is external: it holds no memory here)."""
    s = exp.spec
    pol, sim, alg, env = s.policy, s.user_simulator, s.algorithm, s.environment
    lay = _layout(exp)
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
    return _gpu_plan(exp, policy, simulator, trainer, header, lay, host_capacity)


def _actor_line(exp: Experiment, t: TrainerEstimate, lora: str, lay: _Layout) -> str:
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


def _trainer_rows(t: TrainerEstimate, columns: int, on: list[bool], exp: Experiment) -> list[Row]:
    """The actor-update rows, for the columns where `on` is true."""
    pol = exp.spec.policy

    def row(label: str, value: int, counted: bool = True) -> Row:
        return Row(label, tuple(value if on[i] else 0 for i in range(columns)), counted)

    master = f"fp{8 * t.master_size}"
    gc = "checkpointing on" if pol.gradient_checkpointing else "checkpointing off"
    rows = [
        row(f"actor parameters ({master}, {format_count(t.total_params)} / {t.world})", t.params),
        row(f"actor gradients ({master}, {format_count(t.trainable)} trainable / {t.world})", t.grads),
        row(f"actor AdamW states (2 × {master} / {t.world})", t.optimizer),
    ]
    if t.gathered:
        rows.append(row("FSDP all-gather (root unit + 2 blocks)", t.gathered))
    rows.append(row(f"activations ({t.seqs} × {t.seq_len:,} tokens, {gc})", t.activations))
    if t.attention_scores:
        rows.append(row("attention scores (eager attention)", t.attention_scores))
    rows.append(
        row("logits (fused kernels: chunked)" if pol.use_fused_kernels else "logits (full, fp32 log-softmax)", t.logits)
    )
    if t.separate_reference:
        rows.append(row("reference log-prob step (before the update; not summed)", t.reference_step, counted=False))
    elif exp.spec.algorithm.kl.use_kl_loss:
        rows.append(row("reference: the actor with adapters off", 0))
    return rows


def _cpu_plan(exp: Experiment, t: TrainerEstimate, header: list[tuple[str, str]], host_capacity: int) -> MemoryPlan:
    rows = _trainer_rows(t, 1, [True], exp)
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
            _gc_note(exp, t, "on the host"),
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
                _training_hint(exp, t),
            )
        )
    return MemoryPlan(
        _title(exp),
        tuple(header),
        (),
        (gpu_phases[0], gpu_phases[1], training, gpu_phases[2]),
        host_capacity,
        tuple(issues),
    )


def _gc_note(exp: Experiment, t: TrainerEstimate, where: str) -> str:
    other = "without" if exp.spec.policy.gradient_checkpointing else "with"
    return f"{other} gradient checkpointing the activations would be {gib(t.activations_other)} GiB {where}"


def _title(exp: Experiment) -> str:
    return f"memory plan for {exp.metadata.name} (run {run_name(exp)}); estimates in GiB (2^30 bytes)"


def _training_hint(exp: Experiment, t: TrainerEstimate) -> str:
    pol = exp.spec.policy
    hints = []
    if not pol.gradient_checkpointing:
        hints.append(
            f"turn on policy.gradient_checkpointing (activations {gib(t.activations)} → {gib(t.activations_other)} GiB)"
        )
    if not pol.use_fused_kernels and t.logits:
        hints.append(f"turn on policy.use_fused_kernels (logits {gib(t.logits)} GiB)")
    hints.append("lower algorithm.ppo_micro_batch_size_per_gpu or environment.max_prompt_tokens/max_response_tokens")
    if pol.lora.rank == 0:
        hints.append("train LoRA adapters (policy.lora.rank)")
    return "; ".join(hints)


def _gpu_plan(
    exp: Experiment,
    policy: ModelShape,
    simulator: ModelShape | None,
    t: TrainerEstimate,
    header: list[tuple[str, str]],
    lay: _Layout,
    host_capacity: int,
) -> MemoryPlan:
    s = exp.spec
    pol, roll, sim = s.policy, s.policy.rollout, s.user_simulator
    cap = gpu_capacity(s.resources.gpu_type)
    n = lay.gpus
    columns = tuple(f"GPU {i}" for i in range(n))
    issues: list[Issue] = []
    if (w := cap.warning()) is not None:
        issues.append(Issue("spec.resources.gpu_type", w, "the verdicts use the assumed capacity", blocking=False))
    layout = [f"trainer (FSDP, {lay.world} rank(s)) and policy rollout engine on {_span(lay.trainer)}"]
    if lay.simulator:
        layout.append(f"user simulator (TP {sim.tensor_parallel_size}) on {_span(lay.simulator)} ({sim.gpu_share})")
    layout.append(f"evaluation policy server on {_span(lay.evaluation)}")
    nodes = (
        f"{s.resources.nodes} nodes (plan of node 0, which runs the simulator)" if s.resources.nodes > 1 else "1 node"
    )
    header[:0] = [
        ("GPUs", f"{nodes} × {n} × {cap.describe()}; host {s.resources.memory} per node"),
        ("layout", "; ".join(layout)),
    ]

    pdtype = dtype_bytes(str(pol.dtype))
    # The evaluation server serves merged checkpoints (full weights, no adapter) with the rollout's engine settings.
    engine = dict(
        capacity=cap.bytes,
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
    if lay.simulator and simulator is not None:
        quant = str(sim.quantization)
        sdtype = 2 if quant != Quantization.NONE else pdtype  # dtype "auto" = the checkpoint's 16-bit dtype
        simulated = estimate_engine(
            simulator,
            capacity=cap.bytes,
            gpu_memory_utilization=sim.gpu_memory_utilization,
            tp=sim.tensor_parallel_size,
            dtype_size=sdtype,
            quantization=quant,
            max_model_len=sim.max_model_len,
            max_num_seqs=sim.max_num_seqs,
            batched_tokens=VLLM_SERVE_BATCHED_TOKENS,
            enforce_eager=sim.enforce_eager,
        )
    engines = [
        (
            "policy rollout",
            _engine_line(rollout, roll.gpu_memory_utilization, roll.tensor_parallel_size, cap.bytes, roll.max_num_seqs),
        )
    ]
    if Stage.EVAL in s.stages:
        engines.append(
            (
                "evaluation",
                _engine_line(
                    evaluation, roll.gpu_memory_utilization, roll.tensor_parallel_size, cap.bytes, roll.max_num_seqs
                ),
            )
        )
    if simulated is not None:
        engines.append(
            (
                "simulator",
                _engine_line(
                    simulated, sim.gpu_memory_utilization, sim.tensor_parallel_size, cap.bytes, sim.max_num_seqs
                ),
            )
        )
    level = 1 if pol.lora.rank else 2
    sleeps = roll.free_cache_engine
    freed = rollout.footprint - rollout.asleep
    moved = (
        f"weights and adapter slot {gib(rollout.weights + rollout.lora_slot)} to host RAM"
        if level == 1
        else f"weights {gib(rollout.weights)} discarded (re-sent by the weight sync)"
    )
    engines.append(
        (
            "sleep",
            f"level {level} ({'LoRA adapters' if level == 1 else 'full weights'}): frees "
            f"{gib(freed)} per trainer GPU while the trainer runs (KV cache {gib(max(0, rollout.kv_cache))} "
            f"dropped, {moved}, activation pool {gib(rollout.activation_peak)} released); context and "
            f"CUDA graphs ({gib(rollout.asleep)}) stay"
            if sleeps
            else f"off (policy.rollout.free_cache_engine: false): the engine keeps its "
            f"{gib(rollout.footprint)} per trainer GPU while the trainer runs",
        )
    )
    grpo = Stage.GRPO in s.stages
    if grpo:
        issues += _engine_issues(rollout, "policy rollout engine", "spec.policy.rollout")
    if Stage.EVAL in s.stages and (not grpo or rollout.starts):  # the same fields: report once
        issues += _engine_issues(evaluation, "evaluation policy server", "spec.policy.rollout")
    if simulated is not None:
        issues += _engine_issues(simulated, "user simulator", "spec.user_simulator")

    def on(ids: tuple[int, ...]) -> list[bool]:
        return [i in ids for i in range(n)]

    def row(label: str, value: int, ids: tuple[int, ...], counted: bool = True) -> Row:
        return Row(label, tuple(value if i in ids else 0 for i in range(n)), counted)

    sim_row = (
        [
            row(
                f"user simulator vLLM ({sim.gpu_memory_utilization:.2f} × GPU, TP {sim.tensor_parallel_size})",
                simulated.footprint,
                lay.simulator,
            )
        ]
        if simulated is not None
        else []
    )
    runtime = CUDA_CONTEXT + (NCCL_BUFFERS if lay.world > 1 else 0)
    trainer_proc = row("trainer process (CUDA context, NCCL)", runtime, lay.trainer)
    local_ranks = len(lay.trainer)
    reference_host = t.reference_host * local_ranks
    phases: list[Phase] = []

    # rollout
    rows = [
        *sim_row,
        row(
            f"policy rollout vLLM ({roll.gpu_memory_utilization:.2f} × GPU, TP {roll.tensor_parallel_size})",
            rollout.footprint,
            lay.trainer,
        ),
        trainer_proc,
    ]
    if not pol.param_offload:
        rows.append(row("actor parameters (param_offload off: stay)", t.params, lay.trainer))
    if not pol.optimizer_offload:
        rows.append(row("actor AdamW states (optimizer_offload off: stay)", t.optimizer, lay.trainer))
    host = (
        local_ranks * ((t.params if pol.param_offload else 0) + (t.optimizer if pol.optimizer_offload else 0))
        + reference_host
    )
    phases.append(
        _phase("rollout", "rollout: policy engine generating, trainer idle", columns, cap.bytes, rows, grpo, host)
    )

    # weight sync
    awake = row(
        f"policy rollout vLLM, never asleep ({roll.gpu_memory_utilization:.2f} × GPU)", rollout.footprint, lay.trainer
    )
    woken = row(
        "policy vLLM weights woken (KV cache still freed)",
        rollout.weights + rollout.lora_slot + rollout.asleep,
        lay.trainer,
    )
    phases.append(_sync_phase(exp, policy, t, lay, [*sim_row, woken if sleeps else awake, trainer_proc], cap.bytes))

    # training
    rows = [
        *sim_row,
        row(f"policy vLLM asleep (level {level}: context, CUDA graphs)", rollout.asleep, lay.trainer)
        if sleeps
        else awake,
        trainer_proc,
        *_trainer_rows(t, n, on(lay.trainer), exp),
    ]
    host = (local_ranks * (rollout.weights + rollout.lora_slot) if level == 1 and sleeps else 0) + reference_host
    title = f"policy engine asleep (level {level})" if sleeps else "policy engine awake (free_cache_engine off)"
    phases.append(
        _phase(
            "training",
            f"training: {title}, actor update",
            columns,
            cap.bytes,
            rows,
            grpo,
            host,
            notes=(_gc_note(exp, t, "per GPU"),),
        )
    )

    # evaluation
    rows = [
        *sim_row,
        row(
            f"evaluation policy vLLM ({roll.gpu_memory_utilization:.2f} × GPU, TP {roll.tensor_parallel_size})",
            evaluation.footprint,
            lay.evaluation,
        ),
    ]
    phases.append(
        _phase(
            "evaluation",
            "evaluation: policy server and simulator",
            columns,
            cap.bytes,
            rows,
            Stage.EVAL in s.stages,
            None,
        )
    )

    for p in phases:
        issues += _phase_issues(p, exp, t, host_capacity)
    if Stage.SFT in s.stages:
        issues.append(
            Issue(
                "spec.stages",
                "the sft stage is not planned by this version",
                "its memory is not checked",
                blocking=False,
            )
        )
    return MemoryPlan(_title(exp), tuple(header), tuple(engines), tuple(phases), host_capacity, tuple(issues))


def _sync_phase(
    exp: Experiment, policy: ModelShape, t: TrainerEstimate, lay: _Layout, rows: list[Row], capacity: int
) -> Phase:
    """The weight-sync phase: `rows` (simulator, woken engine, trainer process), then on each trainer GPU the
    sync's peak step (`estimate_sync`: bucket, gathered tensors, shards, the vLLM worker's adapter copies)."""
    pol = exp.spec.policy
    n = lay.gpus
    sync = estimate_sync(
        policy,
        world=lay.world,
        lora_rank=pol.lora.rank,
        lora_targets=pol.lora.target_modules,
        master_size=lay.master_size,
        shards=t.params,
        param_offload=pol.param_offload,
        bucket=lay.bucket,
        base_sync=lay.base_sync,
    )

    def row(label: str, value: int) -> Row:
        return Row(label, tuple(value if i in lay.trainer else 0 for i in range(n)))

    peak = sync.peak
    rows = [*rows, *(row(label, value) for label, value in peak.rows if value)]
    if not pol.optimizer_offload:
        rows.append(row("actor AdamW states (optimizer_offload off)", t.optimizer))
    notes = [f"peak step: {peak.title}"]
    notes += [
        f"other step: {s.title}: {gib(s.total)} GiB ({'; '.join(f'{label} {gib(v)}' for label, v in s.rows if v)})"
        for s in sync.steps
        if s is not peak
    ]
    if sync.host_base:
        notes.append(
            f"the first sync also sends the base weights (rollout.load_format dummy): gathered on the host "
            f"({gib(sync.host_base)} GiB per rank, in the host figure) and sent through the bucket"
        )
    if sync.host_tensor_over_bucket:
        notes.append(
            f"the largest base tensor ({sync.largest_host_tensor >> 20} MiB) exceeds the "
            f"{sync.bucket >> 20} MiB bucket: veRL 0.9.1 sends such a tensor by CUDA IPC, which a host tensor cannot "
            "take, so the first sync fails; a bucket at least that large "
            "(rollout.checkpoint_engine.update_weights_bucket_megabytes) or rollout.load_format auto avoids it"
        )
    local = len(lay.trainer)
    host = local * (sync.host + (t.optimizer if pol.optimizer_offload else 0)) + t.reference_host * local
    grpo = Stage.GRPO in exp.spec.stages
    columns = tuple(f"GPU {i}" for i in range(n))
    return _phase("sync", "weight sync: training → rollout", columns, capacity, rows, grpo, host, tuple(notes))


def _phase(
    name: str,
    title: str,
    columns: tuple[str, ...],
    capacity: int,
    rows: list[Row],
    applies: bool,
    host: int | None,
    notes: tuple[str, ...] = (),
) -> Phase:
    if not applies:
        stage = "eval" if name == "evaluation" else "grpo"
        return Phase(name, title, columns, capacity, applies=False, reason=f"stages do not include {stage}")
    return Phase(name, title, columns, capacity, tuple(rows), host=host, notes=notes)


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


def _phase_issues(p: Phase, exp: Experiment, t: TrainerEstimate, host_capacity: int) -> list[Issue]:
    if not p.applies:
        return []
    out: list[Issue] = []
    sim = exp.spec.user_simulator
    shared = sim.placement == Placement.COLOCATED and sim.gpu_share == GpuShare.SHARED
    over = [(c, tot) for c, tot in zip(p.columns, p.totals(), strict=True) if tot > p.capacity]
    if over:
        where = ", ".join(f"{c}: {gib(tot)} GiB" for c, tot in over)
        message = f"the {p.name} phase needs more than the {gib(p.capacity)} GiB of a GPU ({where})"
        relieve = "lower user_simulator.gpu_memory_utilization or use gpu_share: dedicated" if shared else ""
        if p.name in ("rollout", "evaluation"):
            fieldname = "spec.policy.rollout.gpu_memory_utilization"
            hint = "lower policy.rollout.gpu_memory_utilization" + (f", or {relieve}" if relieve else "")
            if p.name == "rollout" and not (exp.spec.policy.param_offload and exp.spec.policy.optimizer_offload):
                hint += ", or turn on policy.param_offload / optimizer_offload"
        elif p.name == "sync":
            fieldname = "spec.user_simulator.gpu_memory_utilization" if shared else "spec.resources.gpus_per_node"
            hint = (f"{relieve}, " if relieve else "") + "or shard the actor over more GPUs (resources.gpus_per_node)"
        else:
            fieldname = (
                "spec.policy.gradient_checkpointing"
                if not exp.spec.policy.gradient_checkpointing
                else "spec.algorithm.ppo_micro_batch_size_per_gpu"
            )
            hint = _training_hint(exp, t) + (f"; or {relieve}" if relieve else "")
        out.append(Issue(fieldname, message, hint))
    if p.host is not None and p.host > host_capacity:
        out.append(
            Issue(
                "spec.resources.memory",
                f"the {p.name} phase keeps about {gib(p.host)} GiB on the host "
                "(offloaded shards, sleeping engine weights, weights gathered for the sync), more than "
                f"resources.memory {exp.spec.resources.memory}",
                "raise resources.memory or turn off policy.param_offload / optimizer_offload",
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------
# Text


def summarize_memory_plan(plan: MemoryPlan) -> str:
    """One line for `longhaul status` and the Experiment status: per phase the fullest column's total against
    its capacity and the verdict, e.g. `rollout 72.75/80.00 GiB fits · training 77.1/80.00 GiB tight`."""
    parts = []
    for p in plan.phases:
        if not p.applies:
            continue
        total = max(p.totals(), default=0)
        parts.append(f"{p.name} {gib(total)}/{gib(p.capacity)} GiB {verdict(total, p.capacity)}")
    overall = "DOES NOT FIT" if plan.blocking else "fits"
    return f"{overall}: " + " · ".join(parts)


def render_memory_plan(plan: MemoryPlan) -> str:
    """The plan as aligned text (columns of identical GPUs are merged)."""
    lines = [plan.title]
    width = max(len(k) for k, _ in (*plan.header, *plan.engines)) if plan.header else 10
    lines += [f"{k.ljust(width)}  {v}" for k, v in plan.header]
    if plan.engines:
        lines.append("")
        lines.append("vLLM engines (per GPU, GiB)")
        lines += [f"  {k.ljust(width)}  {v}" for k, v in plan.engines]
    for p in plan.phases:
        lines.append("")
        if not p.applies:
            lines.append(f"{p.title}: does not apply ({p.reason})")
            continue
        lines += _phase_table(p)
    for i in plan.issues:
        lines.append(("DOES NOT FIT " if i.blocking else "warning ") + i.render())
    return "\n".join(lines) + "\n"


def _phase_table(p: Phase) -> list[str]:
    groups: list[tuple[str, int]] = []  # (label, first column index) of runs of identical columns
    signature = [tuple(r.values[i] for r in p.rows) for i in range(len(p.columns))]
    start = 0
    for i in range(1, len(p.columns) + 1):
        if i == len(p.columns) or signature[i] != signature[start]:
            if p.columns[start] == "host":
                label = "host"
            else:
                label = p.columns[start] if i - 1 == start else f"GPUs {start}-{i - 1}"
            groups.append((label, start))
            start = i
    label_width = max([len(r.label) for r in p.rows] + [len(p.title), 14]) + 2
    col = max(10, *(len(g) + 2 for g, _ in groups))
    out = [p.title.ljust(label_width) + "".join(g.rjust(col) for g, _ in groups)]
    for r in p.rows:
        out.append(("  " + r.label).ljust(label_width) + "".join(gib(r.values[i]).rjust(col) for _, i in groups))
    totals = p.totals()
    out.append("  total".ljust(label_width) + "".join(gib(totals[i]).rjust(col) for _, i in groups))
    out.append(
        ("  capacity" + (" (resources.memory)" if p.columns == ("host",) else "")).ljust(label_width)
        + "".join(gib(p.capacity).rjust(col) for _ in groups)
    )
    out.append("  headroom".ljust(label_width) + "".join(gib(p.capacity - totals[i]).rjust(col) for _, i in groups))
    out.append("  verdict".ljust(label_width) + "".join(verdict(totals[i], p.capacity).rjust(col) for _, i in groups))
    if p.host is not None:
        out.append(
            f"  host RAM of the node in this phase: {gib(p.host)} GiB "
            "(offloaded shards, sleeping weights, reference, weights gathered for the sync)"
        )
    out += [f"  note: {n}" for n in p.notes]
    return out
