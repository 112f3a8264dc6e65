"""Checkpoints in veRL's layout: `global_step_N/` + `latest_checkpointed_iteration.txt`, written atomically.

A step directory is assembled under a temporary name and renamed into place, then the tracker file is replaced
atomically: a stop at any moment leaves either the previous checkpoint or the new one, never half of one.
`global_step_N/` holds `huggingface/` (model + tokenizer, servable by vLLM as is), `optimizer.pt` and
`trainer_state.json` (step, RNG, anything the loop needs to resume).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from longhaul.launcher.files import atomic_write_json, atomic_write_text

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_PREFIX = "global_step_"
MODEL_SUBDIR = "huggingface"


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"{STEP_PREFIX}{step}"


def latest_step(checkpoint_dir: str | Path) -> int | None:
    """The step in the tracker file if its directory is complete, else None."""
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker}: expected a step number, found {text!r}")
    step = int(text)
    if not (step_dir(checkpoint_dir, step) / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{tracker} points at step {step} but {step_dir(checkpoint_dir, step)} is incomplete")
    return step


def saved_steps(checkpoint_dir: str | Path) -> list[int]:
    """All complete checkpoint steps, ascending."""
    out = []
    for d in Path(checkpoint_dir).glob(f"{STEP_PREFIX}*"):
        suffix = d.name[len(STEP_PREFIX):]
        if suffix.isdigit() and (d / "trainer_state.json").is_file():
            out.append(int(suffix))
    return sorted(out)


def save_checkpoint(checkpoint_dir: str | Path, step: int, model: Any, tokenizer: Any,
                    optimizer: torch.optim.Optimizer | None, state: dict[str, Any]) -> Path:
    """Write `global_step_<step>/` and point the tracker at it; returns the step directory."""
    final = step_dir(checkpoint_dir, step)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / MODEL_SUBDIR).mkdir(parents=True)
    model.save_pretrained(tmp / MODEL_SUBDIR, safe_serialization=True)
    tokenizer.save_pretrained(tmp / MODEL_SUBDIR)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    atomic_write_json(tmp / "trainer_state.json", {"step": step, **state})
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    atomic_write_text(Path(checkpoint_dir) / TRACKER_FILE, f"{step}\n")
    return final


def load_state(checkpoint_dir: str | Path, step: int) -> dict[str, Any]:
    return json.loads((step_dir(checkpoint_dir, step) / "trainer_state.json").read_text())
