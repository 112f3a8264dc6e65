"""The memory plan of a GPU spec (pure): per GPU of the first node, the four phases of a GRPO run and evaluation.

- rollout: the simulator and the policy's rollout engine at their pre-allocated shares, the trainer process
  with whatever `param_offload` / `optimizer_offload` leave on the GPU;
- weight sync: training → rollout; the engine's weights are woken (KV cache still freed) while the actor's
  parameters are on the GPU for the export;
- training: the simulator, the sleeping engine's remainder, and the actor update (parameters, gradients,
  optimizer states, FSDP all-gather, activations, logits);
- evaluation: the simulator and the evaluation policy server.

Those are the phases of sync and colocate_async (`colocated_phases`); `gpu_plan` takes the trainer mode's phases as
an argument, and separate_async's (`longhaul.memory.plan_separate`) reuse the `Node` and the phase builders here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longhaul.memory.estimate import CUDA_CONTEXT, NCCL_BUFFERS, TrainerEstimate
from longhaul.memory.gpus import GpuCapacity, gpu_capacity
from longhaul.memory.plan_engines import Engines, describe_engines, engine_issues, estimate_engines, sleep_line
from longhaul.memory.plan_layout import Layout, span
from longhaul.memory.plan_trainer import gc_note, plan_title, trainer_rows, training_hint
from longhaul.memory.plan_values import Issue, MemoryPlan, Phase, Row, gib
from longhaul.memory.shapes import ModelShape
from longhaul.memory.sync import SyncEstimate, estimate_sync
from longhaul.spec.models import Experiment, Stage
from longhaul.spec.simulator import GpuShare, Placement


@dataclass(frozen=True)
class NodePhases:
    """What a trainer mode places on the node's GPUs: the header's trainer-and-rollout part of the layout, the
    phases and their issues, how the rollout engines sleep, and header lines of its own."""

    layout: str
    phases: tuple[Phase, ...]
    issues: tuple[Issue, ...]
    sleep: str
    header: tuple[tuple[str, str], ...] = ()


#: A trainer mode's phases: (node, policy shape, host capacity) → NodePhases.
PhasePlanner = Callable[["Node", ModelShape, int], NodePhases]


def gpu_plan(
    exp: Experiment,
    policy: ModelShape,
    simulator: ModelShape | None,
    t: TrainerEstimate,
    header: list[tuple[str, str]],
    lay: Layout,
    host_capacity: int,
    planner: PhasePlanner | None = None,
) -> MemoryPlan:
    """The plan of a GPU spec: the node's header lines go before `header`; the engines are estimated at their
    shares, the phases (`planner`'s, by default `colocated_phases`) summed per GPU, and every engine that cannot
    start or phase over capacity is an issue."""
    cap = gpu_capacity(exp.spec.resources.gpu_type)
    issues: list[Issue] = []
    if (w := cap.warning()) is not None:
        issues.append(Issue("spec.resources.gpu_type", w, "the verdicts use the assumed capacity", blocking=False))
    engines = estimate_engines(exp, policy, simulator, colocated=bool(lay.simulator), capacity=cap.bytes)
    issues += engine_issues(exp, engines)
    node = Node(exp, t, lay, engines, cap.bytes)
    placed = (planner or colocated_phases)(node, policy, host_capacity)
    header[:0] = _node_header(exp, lay, cap, placed.layout)
    header += placed.header
    issues += placed.issues
    if Stage.SFT in exp.spec.stages:
        issues.append(
            Issue(
                "spec.stages",
                "the sft stage is not planned by this version",
                "its memory is not checked",
                blocking=False,
            )
        )
    engine_lines = [*describe_engines(exp, engines, cap.bytes), ("sleep", placed.sleep)]
    return MemoryPlan(plan_title(exp), tuple(header), tuple(engine_lines), placed.phases, host_capacity, tuple(issues))


def colocated_phases(node: Node, policy: ModelShape, host_capacity: int) -> NodePhases:
    """sync and colocate_async: the rollout engine shares the trainer's GPUs and sleeps while the trainer runs."""
    lay = node.lay
    phases = (rollout_phase(node), sync_phase(node, policy), training_phase(node), evaluation_phase(node))
    issues = [i for p in phases for i in phase_issues(p, node.exp, node.t, host_capacity)]
    layout = f"trainer (FSDP, {lay.world} rank(s)) and policy rollout engine on {span(lay.trainer)}"
    return NodePhases(layout, phases, tuple(issues), sleep_line(node.engines))


def _node_header(exp: Experiment, lay: Layout, cap: GpuCapacity, trainer: str) -> list[tuple[str, str]]:
    """The node's GPUs and host, and which component runs on which GPUs (`trainer`: the trainer mode's part)."""
    s = exp.spec
    sim = s.user_simulator
    layout = [trainer]
    if lay.simulator:
        layout.append(f"user simulator (TP {sim.tensor_parallel_size}) on {span(lay.simulator)} ({sim.gpu_share})")
    layout.append(f"evaluation policy server on {span(lay.evaluation)}")
    nodes = (
        f"{s.resources.nodes} nodes (plan of node 0, which runs the simulator)" if s.resources.nodes > 1 else "1 node"
    )
    return [
        ("GPUs", f"{nodes} × {lay.gpus} × {cap.describe()}; host {s.resources.memory} per node"),
        ("layout", "; ".join(layout)),
    ]


@dataclass(frozen=True)
class Node:
    """What the phases share: the node's GPU columns and the rows that stay resident across phases."""

    exp: Experiment
    t: TrainerEstimate
    lay: Layout
    engines: Engines
    capacity: int  # bytes per GPU

    def row(self, label: str, value: int, ids: tuple[int, ...], counted: bool = True) -> Row:
        """`value` on the GPUs in `ids`, 0 on the others."""
        return Row(label, tuple(value if i in ids else 0 for i in range(self.lay.gpus)), counted)

    def on(self, ids: tuple[int, ...]) -> list[bool]:
        return [i in ids for i in range(self.lay.gpus)]

    def simulator_rows(self) -> list[Row]:
        """The colocated simulator's share, in every phase (none when it has no GPUs here)."""
        sim, simulated = self.exp.spec.user_simulator, self.engines.simulated
        if simulated is None:
            return []
        label = f"user simulator vLLM ({sim.gpu_memory_utilization:.2f} × GPU, TP {sim.tensor_parallel_size})"
        return [self.row(label, simulated.footprint, self.lay.simulator)]

    def trainer_process(self) -> Row:
        runtime = CUDA_CONTEXT + (NCCL_BUFFERS if self.lay.world > 1 else 0)
        return self.row("trainer process (CUDA context, NCCL)", runtime, self.lay.trainer)

    def engine_awake(self, tag: str = "") -> Row:
        """The rollout engine's whole share, when it never sleeps (free_cache_engine off); `tag` names the kind
        of engine after "vLLM"."""
        roll = self.exp.spec.policy.rollout
        label = f"policy rollout vLLM{tag}, never asleep ({roll.gpu_memory_utilization:.2f} × GPU)"
        return self.row(label, self.engines.rollout.footprint, self.lay.trainer)

    def engine_resting(self, tag: str = "") -> Row:
        """What the trainer GPUs' rollout engine keeps while the trainer runs: asleep, or awake without
        free_cache_engine."""
        if not self.engines.sleeps:
            return self.engine_awake(tag)
        label = f"policy vLLM{tag} asleep (level {self.engines.level}: context, CUDA graphs)"
        return self.row(label, self.engines.rollout.asleep, self.lay.trainer)

    @property
    def engine_moved(self) -> int:
        """Host RAM that the sleeping engines of the node's trainer GPUs hold: sleep level 1 moves the weights and
        adapter slot to the host; level 2 drops them."""
        e = self.engines
        return self.local_ranks * (e.rollout.weights + e.rollout.lora_slot) if e.level == 1 and e.sleeps else 0

    def resident_rows(self) -> list[Row]:
        """The actor's state that `param_offload` / `optimizer_offload` leave on the trainer GPUs between updates."""
        pol, t, ids = self.exp.spec.policy, self.t, self.lay.trainer
        rows = []
        if not pol.param_offload:
            rows.append(self.row("actor parameters (param_offload off: stay)", t.params, ids))
        if not pol.optimizer_offload:
            rows.append(self.row("actor AdamW states (optimizer_offload off: stay)", t.optimizer, ids))
        return rows

    @property
    def resident_host(self) -> int:
        """Host RAM of the node's offloaded actor state between updates, the reference model's included."""
        pol, t = self.exp.spec.policy, self.t
        offloaded = (t.params if pol.param_offload else 0) + (t.optimizer if pol.optimizer_offload else 0)
        return self.local_ranks * offloaded + self.reference_host

    @property
    def local_ranks(self) -> int:
        return len(self.lay.trainer)

    @property
    def reference_host(self) -> int:
        """The separate reference model's parameters on the host, for the node's ranks (in every phase)."""
        return self.t.reference_host * self.local_ranks

    def phase(
        self,
        name: str,
        title: str,
        rows: list[Row],
        applies: bool,
        host: int | None,
        notes: tuple[str, ...] = (),
    ) -> Phase:
        """A phase over the node's GPUs; one the stages do not run says so instead of summing."""
        columns = tuple(f"GPU {i}" for i in range(self.lay.gpus))
        if not applies:
            stage = "eval" if name == "evaluation" else "grpo"
            return Phase(name, title, columns, self.capacity, applies=False, reason=f"stages do not include {stage}")
        return Phase(name, title, columns, self.capacity, tuple(rows), host=host, notes=notes)


def rollout_phase(node: Node) -> Phase:
    """The policy engine generating at its full share; the trainer idle with what offloading leaves on the GPU."""
    roll = node.exp.spec.policy.rollout
    rows = [
        *node.simulator_rows(),
        node.row(
            f"policy rollout vLLM ({roll.gpu_memory_utilization:.2f} × GPU, TP {roll.tensor_parallel_size})",
            node.engines.rollout.footprint,
            node.lay.trainer,
        ),
        node.trainer_process(),
        *node.resident_rows(),
    ]
    grpo = Stage.GRPO in node.exp.spec.stages
    return node.phase("rollout", "rollout: policy engine generating, trainer idle", rows, grpo, node.resident_host)


def sync_phase(node: Node, policy: ModelShape) -> Phase:
    """The weight-sync phase: the simulator, the woken engine and the trainer process, then on each trainer GPU
    the sync's peak step (`estimate_sync`: bucket, gathered tensors, shards, the vLLM worker's adapter copies)."""
    pol, t, lay, rollout = node.exp.spec.policy, node.t, node.lay, node.engines.rollout
    woken = node.row(
        "policy vLLM weights woken (KV cache still freed)",
        rollout.weights + rollout.lora_slot + rollout.asleep,
        lay.trainer,
    )
    resident = [*node.simulator_rows(), woken if node.engines.sleeps else node.engine_awake(), node.trainer_process()]
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
    rows = [*resident, *(node.row(label, value, lay.trainer) for label, value in sync.peak.rows if value)]
    if not pol.optimizer_offload:
        rows.append(node.row("actor AdamW states (optimizer_offload off)", t.optimizer, lay.trainer))
    host = node.local_ranks * (sync.host + (t.optimizer if pol.optimizer_offload else 0)) + node.reference_host
    grpo = Stage.GRPO in node.exp.spec.stages
    return node.phase("sync", "weight sync: training → rollout", rows, grpo, host, sync_notes(sync))


def step_notes(sync: SyncEstimate) -> list[str]:
    """The sync's peak step by name, and the other steps' totals."""
    peak = sync.peak
    notes = [f"peak step: {peak.title}"]
    notes += [
        f"other step: {s.title}: {gib(s.total)} GiB ({'; '.join(f'{label} {gib(v)}' for label, v in s.rows if v)})"
        for s in sync.steps
        if s is not peak
    ]
    return notes


def sync_notes(sync: SyncEstimate) -> tuple[str, ...]:
    """The steps (`step_notes`), and what the first sync does with the base weights."""
    notes = step_notes(sync)
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
    return tuple(notes)


def training_phase(node: Node) -> Phase:
    """The actor update beside the simulator and what the sleeping (or awake) rollout engine keeps."""
    exp, t, lay, e = node.exp, node.t, node.lay, node.engines
    rows = [
        *node.simulator_rows(),
        node.engine_resting(),
        node.trainer_process(),
        *trainer_rows(t, lay.gpus, node.on(lay.trainer), exp),
    ]
    host = node.engine_moved + node.reference_host
    title = f"policy engine asleep (level {e.level})" if e.sleeps else "policy engine awake (free_cache_engine off)"
    grpo = Stage.GRPO in exp.spec.stages
    notes = (gc_note(exp, t, "per GPU"),)
    return node.phase("training", f"training: {title}, actor update", rows, grpo, host, notes=notes)


def evaluation_phase(node: Node) -> Phase:
    """The evaluation policy server beside the simulator."""
    roll = node.exp.spec.policy.rollout
    rows = [
        *node.simulator_rows(),
        node.row(
            f"evaluation policy vLLM ({roll.gpu_memory_utilization:.2f} × GPU, TP {roll.tensor_parallel_size})",
            node.engines.evaluation.footprint,
            node.lay.evaluation,
        ),
    ]
    evaluates = Stage.EVAL in node.exp.spec.stages
    return node.phase("evaluation", "evaluation: policy server and simulator", rows, evaluates, None)


def phase_issues(
    p: Phase, exp: Experiment, t: TrainerEstimate, host_capacity: int, kind: str | None = None
) -> list[Issue]:
    """A phase over a GPU's capacity, named with the field that relieves it (`kind`: the phase whose hints apply,
    `p.name` by default), and over the host's (`host_issues`)."""
    if not p.applies:
        return []
    kind = kind or p.name
    out: list[Issue] = []
    sim = exp.spec.user_simulator
    shared = sim.placement == Placement.COLOCATED and sim.gpu_share == GpuShare.SHARED
    over = [(c, tot) for c, tot in zip(p.columns, p.totals(), strict=True) if tot > p.capacity]
    if over:
        where = ", ".join(f"{c}: {gib(tot)} GiB" for c, tot in over)
        message = f"the {p.name} phase needs more than the {gib(p.capacity)} GiB of a GPU ({where})"
        relieve = "lower user_simulator.gpu_memory_utilization or use gpu_share: dedicated" if shared else ""
        if kind in ("rollout", "evaluation"):
            fieldname = "spec.policy.rollout.gpu_memory_utilization"
            hint = "lower policy.rollout.gpu_memory_utilization" + (f", or {relieve}" if relieve else "")
            if kind == "rollout" and not (exp.spec.policy.param_offload and exp.spec.policy.optimizer_offload):
                hint += ", or turn on policy.param_offload / optimizer_offload"
        elif kind == "sync":
            fieldname = "spec.user_simulator.gpu_memory_utilization" if shared else "spec.resources.gpus_per_node"
            hint = (f"{relieve}, " if relieve else "") + "or shard the actor over more GPUs (resources.gpus_per_node)"
        else:
            fieldname = (
                "spec.policy.gradient_checkpointing"
                if not exp.spec.policy.gradient_checkpointing
                else "spec.algorithm.ppo_micro_batch_size_per_gpu"
            )
            hint = training_hint(exp, t) + (f"; or {relieve}" if relieve else "")
        out.append(Issue(fieldname, message, hint))
    return out + host_issues(p, exp, host_capacity)


def host_issues(p: Phase, exp: Experiment, host_capacity: int) -> list[Issue]:
    """The phase's host RAM over resources.memory."""
    out: list[Issue] = []
    if p.applies and p.host is not None and p.host > host_capacity:
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
