"""Which GPUs of a node each process of a run gets, derived from the spec alone (pure).

Below the renderers and the memory planner, which all need the same answer (the veRL overrides' GPU count, the
servers' `CUDA_VISIBLE_DEVICES`, the memory plan's per-GPU budget).
"""

from __future__ import annotations

from longhaul.spec.models import Experiment
from longhaul.spec.simulator import GpuShare, Placement


def trainer_gpu_ids(exp: Experiment) -> list[int]:
    """GPU indices the trainer uses on each node (a dedicated colocated simulator takes the last ones)."""
    gpus = exp.spec.resources.gpus_per_node
    sim = exp.spec.user_simulator
    if sim.placement == Placement.COLOCATED and sim.gpu_share == GpuShare.DEDICATED:
        return list(range(gpus - sim.tensor_parallel_size))
    return list(range(gpus))
