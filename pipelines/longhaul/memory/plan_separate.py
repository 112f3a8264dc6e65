"""separate_async's phases in the memory plan (pure): rollout replicas on GPUs of their own, the trainer on the rest.

What veRL 0.9.1 does, read from its installed source (paths relative to `verl/`, v1 trainer in trainer/ppo/v1/):

- Standalone replicas: `PPOTrainerSeparateAsync._setup` starts an `LLMServerManager` without a worker group
  (trainer_separate_async.py:148-160), which makes `rollout.n_gpus_per_node × rollout.nnodes ÷ tensor_parallel_size`
  vLLM replicas in resource pools of their own (workers/rollout/llm_server.py:434-483, replica.py:189-225), each
  with the rollout's `gpu_memory_utilization` and `tensor_parallel_size` (vllm_rollout/vllm_async_server.py:340-342).
  longhaul renders `rollout.n_gpus_per_node = rollout_gpus_per_node` and `rollout.nnodes = resources.nodes`
  (`longhaul.spec.placement.rollout_gpu_ids` says which GPUs). They never sleep (`sleep`/`wake_up` skip standalone
  servers, vllm_async_server.py:832-862): they generate through the trainer's phases and pause only for the weight
  sync, which `longhaul.memory.sync_nccl` describes.
- The trainer: FSDP actor (and reference) on `trainer.n_gpus_per_node` = the node's GPUs minus the simulator's and
  the rollout's. Without hybrid rollout longhaul renders `hybrid_engine: false`: veRL then builds a pure Actor role and
  an empty server manager, so the trainer GPUs hold no rollout engine at all (trainer_base.py:366-378, 801-802;
  trainer_separate_async.py:76-82, 175-183). With `hybrid_rollout: true` (`hybrid_engine: true` and
  `hybrid_rollout.enable_switch: true`) the trainer GPUs also host the hybrid replicas of the sync mode (one per
  tensor_parallel_size GPUs, trainer_base.py:371-376, llm_server.py:455-473): asleep while the trainer works
  (`switch_to_trainer` aborts and sleeps them, trainer_separate_async.py:413-420), lent to rollouts between steps
  after their own colocated weight sync ('naive', trainer_base.py:380-382; `switch_to_rollout`,
  trainer_separate_async.py:403-411), which follows the standalone sync in `on_step_end` (:380-391): the
  `hybrid_sync` phase.
- π_old on the host: unless `rollout_correction.bypass_mode` (longhaul never sets it), each old-log-prob computation
  saves the rank's parameter shards to host RAM, keeps that copy for the whole cycle and holds a second one while a
  later mini-batch of the cycle restores it (trainer_separate_async.py:187-211, `DetachActorWorker.save_model_to_cpu`
  in experimental/separation/engine_workers.py:122-137, utils/fsdp_utils.py:1163-1182).

Approximations: the hybrid switch is adaptive (it lends the trainer GPUs only when waiting would cost more than
switching, trainer_separate_async.py:326-371); the plan assumes it happens, every step. The rollout GPUs' rows in
the training and hybrid-sync phases are those of the rollout phase (the standalone replicas generate throughout),
and the vLLM worker's transients while it loads the received tensors are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from longhaul.memory.estimate import CUDA_CONTEXT, NCCL_BUFFERS
from longhaul.memory.plan_engines import sleep_line
from longhaul.memory.plan_gpu import (
    Node,
    NodePhases,
    evaluation_phase,
    host_issues,
    phase_issues,
    step_notes,
    sync_phase,
)
from longhaul.memory.plan_layout import span
from longhaul.memory.plan_trainer import gc_note, trainer_rows
from longhaul.memory.plan_values import Issue, Phase, Row, gib
from longhaul.memory.shapes import ModelShape
from longhaul.memory.sync_nccl import CheckpointSync, estimate_checkpoint_sync
from longhaul.spec.models import Stage
from longhaul.spec.simulator import GpuShare, Placement
from longhaul.spec.trainer_mode import parameter_sync_step


@dataclass(frozen=True)
class _Separate:
    """The node, its standalone rollout GPUs, whether the trainer GPUs host hybrid replicas, and the NCCL sync."""

    node: Node
    hybrid: bool
    sync: CheckpointSync

    @property
    def rollout(self) -> tuple[int, ...]:
        return self.node.lay.rollout

    @property
    def grpo(self) -> bool:
        return Stage.GRPO in self.node.exp.spec.stages

    def engine_label(self, kind: str) -> str:
        """A policy engine at its share: `kind` is standalone or hybrid."""
        roll = self.node.exp.spec.policy.rollout
        return f"policy rollout vLLM ({kind}) ({roll.gpu_memory_utilization:.2f} × GPU, TP {roll.tensor_parallel_size})"

    def standalone_rows(self) -> list[Row]:
        """A standalone replica generating at its full share, and its checkpoint-engine worker (a process of its
        own on each of the replica's GPUs, with a CUDA context and the NCCL group from the first sync on)."""
        engine = self.node.row(self.engine_label("standalone"), self.node.engines.rollout.footprint, self.rollout)
        return [engine, self.worker_row()]

    def worker_row(self) -> Row:
        return self.node.row("checkpoint-engine worker (CUDA context, NCCL)", CUDA_CONTEXT + NCCL_BUFFERS, self.rollout)

    def group_row(self) -> Row:
        """The trainer's side of the checkpoint engine's NCCL group, kept between syncs."""
        return self.node.row("checkpoint-engine NCCL group (trainer side)", NCCL_BUFFERS, self.node.lay.trainer)

    def hybrid_rows(self) -> list[Row]:
        """The hybrid replicas while the trainer works (asleep, or awake without free_cache_engine)."""
        return [self.node.engine_resting(" (hybrid)")] if self.hybrid else []

    def pi_old(self, copies: int) -> int:
        """Host RAM of the saved π_old shards of the node's ranks."""
        return copies * self.node.local_ranks * self.node.t.params


def separate_phases(node: Node, policy: ModelShape, host_capacity: int) -> NodePhases:
    """separate_async's phases on the node: rollout, the standalone replicas' weight sync, (with hybrid rollout)
    the hybrid replicas' weight sync, training and evaluation; see the module docstring for what veRL does."""
    exp, lay = node.exp, node.lay
    pol = exp.spec.policy
    sep = _Separate(
        node,
        exp.spec.algorithm.trainer.hybrid_rollout,
        estimate_checkpoint_sync(
            policy,
            world=lay.world,
            master_size=lay.master_size,
            shards=node.t.params,
            param_offload=pol.param_offload,
            bucket=lay.bucket,
        ),
    )
    phases = [_rollout_phase(sep), _sync_phase(sep)]
    if sep.hybrid:
        phases.append(_hybrid_sync_phase(sep, policy))
    phases += [_training_phase(sep), evaluation_phase(node)]
    trainer = f"trainer (FSDP, {lay.world} rank(s)){' and hybrid rollout replicas' if sep.hybrid else ''}"
    layout = f"{trainer} on {span(lay.trainer)}; standalone policy rollout replicas on {span(sep.rollout)}"
    issues = [i for p in phases for i in _issues(p, sep, host_capacity)]
    return NodePhases(layout, tuple(phases), tuple(issues), _sleep(sep), (("rollout", _rollout_line(sep)),))


def _rollout_line(sep: _Separate) -> str:
    """The header line: which GPUs serve rollouts, in how many replicas."""
    exp, lay = sep.node.exp, sep.node.lay
    t, tp = exp.spec.algorithm.trainer, exp.spec.policy.rollout.tensor_parallel_size
    hybrid = (
        f"{len(lay.trainer) // tp} hybrid replica(s) of TP {tp}, lent to rollouts while the trainer waits"
        if sep.hybrid
        else "no rollout replicas"
    )
    return (
        f"separate_async: {span(sep.rollout)} serve rollouts only, {len(sep.rollout) // tp} standalone vLLM "
        f"replica(s) of TP {tp} per node (algorithm.trainer.rollout_gpus_per_node {t.rollout_gpus_per_node}); "
        f"trainer {span(lay.trainer)}: {hybrid}"
    )


def _sleep(sep: _Separate) -> str:
    """The engines' sleep line: the standalone replicas only free their KV cache for the sync; the hybrid
    replicas sleep as the sync mode's engine does."""
    e = sep.node.engines
    standalone = (
        f"standalone replicas never sleep; for each weight sync they free their KV cache "
        f"({gib(max(0, e.rollout.kv_cache))}) and activation pool and keep their weights (free_cache_engine)"
        if e.sleeps
        else "standalone replicas never sleep and keep their whole share through the weight sync "
        "(free_cache_engine off)"
    )
    return standalone + (f"; hybrid replicas: {sleep_line(e)}" if sep.hybrid else "")


def _rollout_phase(sep: _Separate) -> Phase:
    """The standalone replicas generating; the trainer waiting with what offloading leaves on its GPUs, or its
    GPUs lent to the hybrid replicas."""
    node = sep.node
    rows = node.simulator_rows()
    if sep.hybrid:
        rows.append(node.row(sep.engine_label("hybrid"), node.engines.rollout.footprint, node.lay.trainer))
    rows += [node.trainer_process(), sep.group_row(), *node.resident_rows(), *sep.standalone_rows()]
    title = "rollout: standalone replicas generating, " + (
        "hybrid replicas too while the trainer waits" if sep.hybrid else "trainer waiting for samples"
    )
    return node.phase("rollout", title, rows, sep.grpo, node.resident_host + sep.pi_old(1))


def _sync_phase(sep: _Separate) -> Phase:
    """The NCCL sync to the standalone replicas at the end of a step: the sender's peak on the trainer GPUs (the
    hybrid replicas asleep), the replicas' weights and the receiver's buffers on the rollout GPUs."""
    node, cs = sep.node, sep.sync
    pol, t, lay, e = node.exp.spec.policy, node.t, node.lay, node.engines
    rows = [*node.simulator_rows(), *sep.hybrid_rows(), node.trainer_process(), sep.group_row()]
    rows += [node.row(label, value, lay.trainer) for label, value in cs.sender.peak.rows if value]
    if not pol.optimizer_offload:
        rows.append(node.row("actor AdamW states (optimizer_offload off)", t.optimizer, lay.trainer))
    if e.sleeps:
        weights = e.rollout.weights + e.rollout.asleep  # full weights only: no adapter slot (check_trainer_lora)
        rows.append(node.row("policy vLLM (standalone) weights (KV cache freed for the sync)", weights, sep.rollout))
    else:
        label = "policy rollout vLLM (standalone), whole share (free_cache_engine off)"
        rows.append(node.row(label, e.rollout.footprint, sep.rollout))
    rows += [sep.worker_row(), *(node.row(label, value, sep.rollout) for label, value in cs.receiver if value)]
    optimizer = t.optimizer if pol.optimizer_offload else 0
    hybrid_moved = node.engine_moved if sep.hybrid else 0
    host = node.local_ranks * (cs.sender.host + optimizer) + node.reference_host + sep.pi_old(1) + hybrid_moved
    notes = [*step_notes(cs.sender), "the rollout GPUs' vLLM workers load each tensor in place (not counted)"]
    title = "weight sync: trainer → standalone replicas (NCCL checkpoint engine)"
    return node.phase("sync", title, rows, sep.grpo, host, tuple(notes))


def _hybrid_sync_phase(sep: _Separate, policy: ModelShape) -> Phase:
    """The hybrid replicas' colocated sync when they are lent to rollouts (the sync mode's weight sync), the
    standalone replicas generating meanwhile."""
    base = sync_phase(sep.node, policy)
    title = "weight sync: trainer → hybrid replicas (switch to rollout)"
    if not base.applies:
        return replace(base, name="hybrid_sync", title=title)
    rows = (*base.rows, sep.group_row(), *sep.standalone_rows())
    host = (base.host or 0) + sep.pi_old(1)
    return replace(base, name="hybrid_sync", title=title, rows=rows, host=host)


def _training_phase(sep: _Separate) -> Phase:
    """The actor update (the hybrid replicas asleep) while the standalone replicas generate."""
    node = sep.node
    exp, t, lay = node.exp, node.t, node.lay
    alg = exp.spec.algorithm
    rows = [
        *node.simulator_rows(),
        *sep.hybrid_rows(),
        node.trainer_process(),
        sep.group_row(),
        *trainer_rows(t, lay.gpus, node.on(lay.trainer), exp),
        *sep.standalone_rows(),
    ]
    # a later mini-batch of the cycle restores π_old while the current weights wait on the host too
    copies = 2 if parameter_sync_step(alg.train_batch_size, alg.ppo_mini_batch_size) > 1 else 1
    host = (node.engine_moved if sep.hybrid else 0) + node.reference_host + sep.pi_old(copies)
    notes = (
        gc_note(exp, t, "per GPU"),
        f"π_old: {copies} host cop{'ies' if copies > 1 else 'y'} of each rank's parameter shards "
        f"({gib(t.params)} GiB each; one of them is in the host figure of the other GRPO phases)",
    )
    title = "training: actor update, " + (
        "hybrid replicas asleep, standalone replicas generating" if sep.hybrid else "standalone replicas generating"
    )
    return node.phase("training", title, rows, sep.grpo, host, notes)


def _issues(p: Phase, sep: _Separate, host_capacity: int) -> list[Issue]:
    """The phase's issues, the trainer's GPUs (and a dedicated simulator's) apart from the rollout GPUs."""
    node = sep.node
    exp, t = node.exp, node.t
    if p.name == "evaluation":
        return phase_issues(p, exp, t, host_capacity)
    out: list[Issue] = []
    trainer_side = _columns(p, lambda i: i not in sep.rollout)
    if p.name == "rollout" and not sep.hybrid:
        # without hybrid replicas the trainer GPUs' rollout rows are a subset of their training rows
        out += host_issues(p, exp, host_capacity)
    else:
        out += phase_issues(trainer_side, exp, t, host_capacity, kind="sync" if p.name == "hybrid_sync" else None)
    # the rollout GPUs hold the same in rollout, training and the hybrid sync: checked once, in rollout
    if p.name in ("rollout", "sync"):
        out += _rollout_gpu_issues(_columns(p, lambda i: i in sep.rollout), sep)
    return out


def _columns(p: Phase, keep: Callable[[int], bool]) -> Phase:
    """`p` restricted to the GPUs whose index `keep` accepts."""
    idx = [i for i in range(len(p.columns)) if keep(i)]
    rows = tuple(replace(r, values=tuple(r.values[i] for i in idx)) for r in p.rows)
    return replace(p, columns=tuple(p.columns[i] for i in idx), rows=rows)


def _rollout_gpu_issues(p: Phase, sep: _Separate) -> list[Issue]:
    """A rollout GPU over capacity, with the fields that relieve it."""
    if not p.applies:
        return []
    over = [(c, tot) for c, tot in zip(p.columns, p.totals(), strict=True) if tot > p.capacity]
    if not over:
        return []
    exp, lay = sep.node.exp, sep.node.lay
    where = ", ".join(f"{c}: {gib(tot)} GiB" for c, tot in over)
    message = f"the {p.name} phase needs more than the {gib(p.capacity)} GiB of a rollout GPU ({where})"
    if p.name == "sync" and not exp.spec.policy.rollout.free_cache_engine:
        field = "spec.policy.rollout.free_cache_engine"
        hint = (
            "turn on policy.rollout.free_cache_engine (veRL then frees the standalone replicas' KV cache for each "
            "sync), or lower policy.rollout.gpu_memory_utilization"
        )
    else:
        field = "spec.policy.rollout.gpu_memory_utilization"
        hint = (
            "lower policy.rollout.gpu_memory_utilization: each standalone replica takes that share of its GPUs, and "
            "its checkpoint-engine worker comes on top"
        )
    sim = exp.spec.user_simulator
    shared = sim.placement == Placement.COLOCATED and sim.gpu_share == GpuShare.SHARED
    if shared and set(lay.simulator) & set(sep.rollout):
        hint += ", or lower user_simulator.gpu_memory_utilization or use gpu_share: dedicated"
    return [Issue(field, message, hint)]
