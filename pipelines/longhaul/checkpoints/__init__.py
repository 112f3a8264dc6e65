"""veRL's checkpoint layout, and turning a saved step into a servable Hugging Face model (I/O).

The one place that knows how veRL 0.9.1 lays checkpoints out. Under `trainer.default_local_dir`:

    latest_checkpointed_iteration.txt          the newest step; written after all of that step's files
    global_step_<N>/actor/                     FSDP shards of the policy (`main_ppo`; `critic/` likewise)
        fsdp_config.json                       {"FSDP_version": .., "world_size": W}
        model_world_size_<W>_rank_<R>.pt       one model shard per rank (optim_…, extra_state_… beside it)
        huggingface/                           config + tokenizer only (no weights, unless hf_model is saved)
        lora_train_meta.json                   LoRA rank/alpha, when LoRA is on
    global_step_<N>/data.pt                    dataloader state

veRL's SFT trainer writes the same shard files directly in `global_step_<N>/` (no `actor/`): every function
takes `component` (`"actor"` by default, `None` for that layout).

The steps, their completeness and the resume are in `longhaul.checkpoints.steps`; turning a step into a servable
model in `longhaul.checkpoints.merge`. Every public name is importable from `longhaul.checkpoints`.
"""

from longhaul.checkpoints.merge import (
    LORA_ADAPTER_SUBDIR,
    MERGE_RECORD,
    MergeAborted,
    merge_checkpoint,
    merge_lora_adapter,
    merged_model_dir,
)
from longhaul.checkpoints.steps import (
    ACTOR_SUBDIR,
    DATALOADER_FILE,
    FSDP_CONFIG_FILE,
    HF_SUBDIR,
    SHARD_KINDS,
    STEP_PREFIX,
    TRACKER_FILE,
    CheckpointError,
    ResumePoint,
    file_whole,
    latest_step,
    prepare_resume,
    saved_steps,
    shard_dir,
    shards_complete,
    step_complete,
    step_dir,
    tracker_step,
)

__all__ = [
    "ACTOR_SUBDIR",
    "DATALOADER_FILE",
    "FSDP_CONFIG_FILE",
    "HF_SUBDIR",
    "LORA_ADAPTER_SUBDIR",
    "MERGE_RECORD",
    "SHARD_KINDS",
    "STEP_PREFIX",
    "TRACKER_FILE",
    "CheckpointError",
    "MergeAborted",
    "ResumePoint",
    "file_whole",
    "latest_step",
    "merge_checkpoint",
    "merge_lora_adapter",
    "merged_model_dir",
    "prepare_resume",
    "saved_steps",
    "shard_dir",
    "shards_complete",
    "step_complete",
    "step_dir",
    "tracker_step",
]
