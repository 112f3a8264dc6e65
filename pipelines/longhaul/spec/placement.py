"""Which GPUs of a node each process of a run gets, derived from the spec alone (pure).

Below the renderers and the memory planner, which all need the same answer (the veRL overrides' GPU count, the
servers' `CUDA_VISIBLE_DEVICES`, the memory plan's per-GPU budget).
"""

from __future__ import annotations

from longhaul.spec.models import Experiment
from longhaul.spec.simulator import GpuShare, Placement


def _free_gpus(exp: Experiment) -> int:
    """GPUs of a node left after a dedicated colocated simulator (which takes the last ones)."""
    gpus = exp.spec.resources.gpus_per_node
    sim = exp.spec.user_simulator
    if sim.placement == Placement.COLOCATED and sim.gpu_share == GpuShare.DEDICATED:
        return gpus - sim.tensor_parallel_size
    return gpus


def trainer_gpu_ids(exp: Experiment) -> list[int]:
    """GPU indices the trainer uses on each node (a dedicated colocated simulator takes the last ones, the
    rollout GPUs of `algorithm.trainer.mode: separate_async` the ones before them)."""
    return list(range(_free_gpus(exp) - exp.spec.algorithm.trainer.rollout_gpus_per_node))


def rollout_gpu_ids(exp: Experiment) -> list[int]:
    """GPU indices of each node that serve rollouts only (`separate_async`'s `rollout_gpus_per_node`; empty in
    the other modes, whose rollouts share the trainer's GPUs)."""
    free = _free_gpus(exp)
    return list(range(free - exp.spec.algorithm.trainer.rollout_gpus_per_node, free))
