"""Turn the last veRL SFT checkpoint into a plain Hugging Face model for the GRPO stage (I/O).

veRL's SFT trainer writes the FSDP shards directly in `global_step_N/` (no `actor/`). The merge is the one in
`longhaul.checkpoints` (veRL's model merger, then the LoRA adapter merged into the base with PEFT: GRPO wants
one model, as the original merged its SFT adapter before RL), atomic and skipped when already done.
"""

from __future__ import annotations

from pathlib import Path

from longhaul.checkpoints import latest_step, merge_checkpoint

#: veRL's SFT trainer keeps the shards in the step directory itself.
SFT_COMPONENT = None


def export_sft_model(checkpoints: str | Path, base_model: str, out_dir: str | Path) -> int:
    """Export the latest complete checkpoint under `checkpoints` to `out_dir`; returns the step exported."""
    step = latest_step(checkpoints, component=SFT_COMPONENT)
    if step is None:
        raise FileNotFoundError(f"{checkpoints}: no complete global_step_N checkpoint (did the SFT train step run?)")
    merge_checkpoint(checkpoints, step, out_dir, base_model, component=SFT_COMPONENT)
    return step
