"""Turn the last veRL SFT checkpoint into a plain Hugging Face model for the GRPO stage (I/O).

veRL's `model_merger` gathers the FSDP shards of `global_step_N/` into a Hugging Face directory; with LoRA it
writes the frozen base weights plus `lora_adapter/`. GRPO wants one model (the original merged its SFT adapter
before RL), so the adapter is merged into the base with PEFT and the tokenizer files are copied alongside.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

_STEP = re.compile(r"^global_step_(\d+)$")


def latest_step(checkpoints: Path) -> int:
    """The newest step: veRL's tracker file if present, else the highest `global_step_N` directory."""
    checkpoints = Path(checkpoints)
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    if tracker.exists():
        return int(tracker.read_text().strip())
    steps = [int(m.group(1)) for p in checkpoints.iterdir() if (m := _STEP.match(p.name))] if checkpoints.exists() else []
    if not steps:
        raise FileNotFoundError(f"{checkpoints}: no global_step_N checkpoint (did the SFT train step run?)")
    return max(steps)


def merge_lora_adapter(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path,
                       tokenizer_dir: str | Path | None = None) -> None:
    """Base model + PEFT LoRA adapter → one merged model saved to `out_dir`, with the tokenizer of
    `tokenizer_dir` (default: the base's)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype="auto")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir or base_dir).save_pretrained(out)


def export_sft_model(checkpoints: str | Path, base_model: str, out_dir: str | Path) -> int:
    """Export the latest checkpoint under `checkpoints` to `out_dir`; returns the step exported."""
    from transformers import AutoTokenizer

    step = latest_step(Path(checkpoints))
    local = Path(checkpoints) / f"global_step_{step}"
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".merging")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(local),
                    "--target_dir", str(tmp)], check=True)
    final = out.with_name(out.name + ".partial")
    shutil.rmtree(final, ignore_errors=True)
    if (tmp / "lora_adapter").is_dir():
        merge_lora_adapter(tmp, tmp / "lora_adapter", final, tokenizer_dir=base_model)
    else:
        tmp.rename(final)
        AutoTokenizer.from_pretrained(base_model).save_pretrained(final)
    shutil.rmtree(out, ignore_errors=True)
    final.rename(out)
    shutil.rmtree(tmp, ignore_errors=True)
    return step
