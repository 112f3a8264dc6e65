"""`spec.algorithm.trainer`: how rollout and training overlap — veRL 0.9.1's v1 trainer modes and their settings.

`sync` (the default) waits for a step's slowest conversation before it trains. `colocate_async` keeps rollouts
running between steps on the same devices: at each step's weight update veRL aborts the unfinished generations and
resumes them with the new weights (a partial rollout), so a trajectory can span several policy versions.
`separate_async` serves rollouts from GPUs of their own and syncs weights to them once per step. docs/async-modes.md
says what veRL does in each mode, with references to its source.

The section is left out of the resolved spec (and so of the spec hash) while it holds only defaults: a spec that
names no trainer mode is the same run it was before the section existed.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import MAX_GPUS_PER_NODE, MAX_STEPS

#: Warm-up batches veRL's async trainers prefetch before the first step (veRL's default: 1).
DEFAULT_WARMUP_BATCHES = 1.0
MAX_WARMUP_BATCHES = 64.0
#: Policy versions a trajectory may span before veRL drops it or waits for it (veRL's default: 8).
DEFAULT_MAX_STALENESS = 8
#: The truncated importance weight's upper bound (veRL's `rollout_is_threshold` default: 2.0).
DEFAULT_IS_THRESHOLD = 2.0
MAX_IS_THRESHOLD = 1_000.0


class TrainerMode(StrEnum):
    SYNC = "sync"
    COLOCATE_ASYNC = "colocate_async"
    SEPARATE_ASYNC = "separate_async"


class StaleStrategy(StrEnum):
    DROP = "drop"
    WAIT = "wait"


class ImportanceSampling(StrEnum):
    NONE = "none"
    TOKEN = "token"
    SEQUENCE = "sequence"


ASYNC_MODES = (TrainerMode.COLOCATE_ASYNC, TrainerMode.SEPARATE_ASYNC)


class TrainerSpec(SpecModel):
    """veRL's v1 trainer mode (sync, colocate_async, separate_async) and the settings of the asynchronous modes."""

    mode: TrainerMode = Field(
        default=TrainerMode.SYNC,
        description="sync: each step waits for its slowest conversation. colocate_async: rollouts continue between "
        "steps on the trainer's devices; unfinished generations are aborted at each weight update and resumed with "
        "the new weights. separate_async: rollouts on GPUs of their own (rollout_gpus_per_node), weights synced "
        "once per step (GPU only).",
    )
    warmup_batches: float = Field(
        default=DEFAULT_WARMUP_BATCHES,
        ge=0.0,
        le=MAX_WARMUP_BATCHES,
        description="Async modes: batches of prompts submitted before the first step, so rollouts run ahead of "
        "training (fractions allowed: 1.5 × train_batch_size prompts, rounded down).",
    )
    max_staleness: int | None = Field(
        default=DEFAULT_MAX_STALENESS,
        ge=1,
        le=MAX_STEPS,
        description="Async modes: the most policy versions a trajectory may span, counted from the step its prompt "
        "was submitted in (veRL's max_off_policy_threshold); null: no limit.",
    )
    stale: StaleStrategy = Field(
        default=StaleStrategy.DROP,
        description="Async modes: drop a finished trajectory beyond max_staleness (its prompt is replaced), or wait: "
        "hold sampling until in-flight prompts at the limit finish, and train on them.",
    )
    rollout_gpus_per_node: int = Field(
        default=0,
        ge=0,
        le=MAX_GPUS_PER_NODE,
        description="separate_async: GPUs of each node that serve rollouts only (taken from resources.gpus_per_node; "
        "the trainer gets the rest).",
    )
    hybrid_rollout: bool = Field(
        default=False,
        description="separate_async: also serve rollouts from the trainer's GPUs while the trainer would wait "
        "(veRL's hybrid_rollout.enable_switch).",
    )
    importance_sampling: ImportanceSampling = Field(
        default=ImportanceSampling.NONE,
        description="Off-policy correction: truncated importance weights π_old / π_rollout per token or per "
        "sequence on the policy loss (veRL's rollout_is); none: no weights (veRL still logs the mismatch).",
    )
    importance_threshold: float = Field(
        default=DEFAULT_IS_THRESHOLD,
        ge=1.0,
        le=MAX_IS_THRESHOLD,
        description="Upper bound of the truncated importance weights (veRL's rollout_is_threshold).",
    )

    @model_validator(mode="after")
    def _mode_settings(self) -> TrainerSpec:
        mode = self.mode
        if mode == TrainerMode.SYNC:
            given = {
                "warmup_batches": self.warmup_batches != DEFAULT_WARMUP_BATCHES,
                "max_staleness": self.max_staleness != DEFAULT_MAX_STALENESS,
                "stale": self.stale != StaleStrategy.DROP,
            }
            for name, changed in given.items():
                if changed:
                    raise FieldError(
                        name,
                        f"{name} applies to the async modes only (sync trains on-policy, nothing is stale): remove "
                        "it, or set mode: colocate_async or separate_async",
                    )
        if mode != TrainerMode.SEPARATE_ASYNC:
            for name, given in {
                "rollout_gpus_per_node": self.rollout_gpus_per_node,
                "hybrid_rollout": self.hybrid_rollout,
            }.items():
                if given:
                    raise FieldError(
                        name,
                        f"{name} applies to mode separate_async only (mode is {mode}): remove it, or set "
                        "mode: separate_async",
                    )
        elif self.rollout_gpus_per_node == 0:
            raise FieldError(
                "rollout_gpus_per_node",
                "separate_async serves rollouts from GPUs of their own: set rollout_gpus_per_node (at least 1)",
            )
        if self.stale == StaleStrategy.WAIT and self.max_staleness is None:
            raise FieldError("stale", "stale: wait waits for trajectories at max_staleness: set max_staleness")
        if self.importance_sampling == ImportanceSampling.NONE and self.importance_threshold != DEFAULT_IS_THRESHOLD:
            raise FieldError(
                "importance_threshold",
                "importance_threshold bounds the importance weights, which are not used (importance_sampling: "
                "none): remove it, or set importance_sampling: token or sequence",
            )
        return self

    @property
    def is_async(self) -> bool:
        """Whether rollouts overlap training (colocate_async, separate_async)."""
        return self.mode in ASYNC_MODES


def check_parameter_sync(trainer: TrainerSpec, train_batch_size: int, ppo_mini_batch_size: int) -> None:
    """separate_async trains one mini-batch per sample and syncs weights to the rollout GPUs every
    train_batch_size / ppo_mini_batch_size of them (veRL's parameter_sync_step, which must divide exactly)."""
    if trainer.mode == TrainerMode.SEPARATE_ASYNC and train_batch_size % ppo_mini_batch_size:
        raise FieldError(
            "ppo_mini_batch_size",
            f"separate_async syncs weights every train_batch_size / ppo_mini_batch_size optimizer steps (veRL's "
            f"parameter_sync_step): ppo_mini_batch_size ({ppo_mini_batch_size}) must divide train_batch_size "
            f"({train_batch_size})",
        )


def parameter_sync_step(train_batch_size: int, ppo_mini_batch_size: int) -> int:
    """veRL's parameter_sync_step for separate_async: the optimizer steps between two weight syncs."""
    return train_batch_size // ppo_mini_batch_size


def check_trainer_devices(trainer: TrainerSpec, gpus_per_node: int, trainer_gpus: int, rollout_tp: int) -> None:
    """Cross-section rules of the trainer mode: separate_async needs GPUs, leaves the trainer at least one and
    gives the rollout whole tensor-parallel engines. `trainer_gpus`: the node's GPUs left after the simulator."""
    if trainer.mode != TrainerMode.SEPARATE_ASYNC:
        return
    field = "algorithm.trainer.mode"
    if gpus_per_node == 0:
        raise FieldError(
            field,
            "separate_async needs GPUs (resources.gpus_per_node: 0): veRL sends its weights to the rollout replicas "
            "over an NCCL/NIXL checkpoint engine and refuses 'naive', the only one on the CPU platform; use "
            "colocate_async on CPU",
        )
    rollout = trainer.rollout_gpus_per_node
    if rollout >= trainer_gpus:
        raise FieldError(
            "algorithm.trainer.rollout_gpus_per_node",
            f"rollout_gpus_per_node ({rollout}) leaves none of the {trainer_gpus} GPU(s) available to the trainer; "
            "use fewer rollout GPUs or more resources.gpus_per_node",
        )
    if rollout % rollout_tp:
        raise FieldError(
            "algorithm.trainer.rollout_gpus_per_node",
            f"rollout_gpus_per_node ({rollout}) must be a multiple of policy.rollout.tensor_parallel_size "
            f"({rollout_tp}): each rollout replica takes that many GPUs",
        )


def check_trainer_lora(trainer: TrainerSpec, lora_rank: int) -> None:
    """separate_async with LoRA is refused: veRL 0.9.1's sync to the standalone rollout replicas exports the base
    weights only (`get_per_tensor_param()` without `base_sync_done`, so `collect_lora_params` skips the `lora_`
    tensors; workers/engine_workers.py:764, utils/fsdp_utils.py:761-774): the replicas would keep generating with
    the untrained base model while the trainer updates the adapters."""
    if trainer.mode == TrainerMode.SEPARATE_ASYNC and lora_rank > 0:
        raise FieldError(
            "algorithm.trainer.mode",
            f"separate_async with LoRA (policy.lora.rank {lora_rank}): veRL 0.9.1 syncs only the base weights to "
            "the standalone rollout replicas, which would never generate with the trained adapters; use "
            "colocate_async, or policy.lora.rank: 0",
        )
