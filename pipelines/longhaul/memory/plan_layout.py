"""Where the plan's components run and in which dtypes (pure): read from the launch plan and the veRL overrides.

The simulator's and the evaluation server's GPUs come from `longhaul.render.plan`, the trainer's and separate_async's
rollout GPUs from the spec's placement, and the actor's dtypes and the weight sync's settings from the rendered veRL
overrides, so the plan describes what the job will run (one fact, one place).
"""

from __future__ import annotations

from dataclasses import dataclass

from longhaul import constants as C
from longhaul.layout import Paths
from longhaul.memory.estimate import dtype_bytes
from longhaul.render.plan import render_policy_server, render_simulator_server
from longhaul.render.verl import render_verl_overrides
from longhaul.spec.models import Experiment
from longhaul.spec.placement import rollout_gpu_ids, trainer_gpu_ids

#: veRL 0.9.1 defaults the plan relies on when the rendered overrides do not set them (trainer/config/engine/fsdp.yaml;
#: the weight-sync bucket and the rollout's load format: trainer/config/rollout/rollout.yaml).
VERL_MODEL_DTYPE = "fp32"
VERL_BUCKET_MEGABYTES = "2048"
VERL_LOAD_FORMAT = "dummy"


@dataclass(frozen=True)
class Layout:
    """The node's GPUs, who runs on which, and the trainer's dtypes and weight-sync settings."""

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
    rollout: tuple[int, ...] = ()  # separate_async's standalone rollout GPUs (none in the other modes)


def build_layout(exp: Experiment) -> Layout:
    """The layout of `exp`'s first node (the one that also runs the simulator)."""
    s = exp.spec
    overrides = render_verl_overrides(exp, Paths.under("run"))
    actor = "actor_rollout_ref.actor.fsdp_config"
    master = _override(overrides, f"{actor}.model_dtype", VERL_MODEL_DTYPE)
    # The FSDP engine computes in `mixed_precision.param_dtype`, which the renderer sets to the spec's dtype
    # (`longhaul.render.verl.fsdp_mixed_precision`).
    compute = str(s.policy.dtype)
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
    return Layout(
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
        () if cpu else tuple(rollout_gpu_ids(exp)),
    )


def span(ids: tuple[int, ...] | list[int]) -> str:
    """'GPU 0', 'GPUs 0-3', 'GPUs 0,2'."""
    ids = sorted(ids)
    if len(ids) == 1:
        return f"GPU {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"GPUs {ids[0]}-{ids[-1]}"
    return "GPUs " + ",".join(str(i) for i in ids)


def _visible(env: dict[str, str]) -> list[int]:
    devices = env.get(C.CUDA_MASK_VAR, "")  # positions in the job's mask
    return [int(d) for d in devices.split(",") if d.strip()]


def _override(overrides: list[str], key: str, default: str) -> str:
    for o in overrides:
        if o.startswith(key + "="):
            return o.split("=", 1)[1]
    return default
