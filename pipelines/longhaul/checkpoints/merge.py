"""Turning a complete checkpoint step into a servable Hugging Face model (I/O).

Merging (`merge_checkpoint`): veRL's own `python -m verl.model_merger merge --backend fsdp` (run with this
interpreter) gathers the shards into a Hugging Face directory; with LoRA it writes the base weights plus
`lora_adapter/`, which PEFT merges into one model; the tokenizer comes from the checkpoint (or `base_model`).
The merger writes bfloat16 weights whatever the training dtype (veRL's behaviour; the server's `--dtype`
decides what is served). Everything is written under `.<name>.merging/` next to the target and renamed into
place, so a directory at the target is always a whole merge; a leftover `.merging` directory (an interrupted
merge) is discarded and the merge redone. The merge records its source in `longhaul_merge.json`; merging the
same source again is a no-op, a different source replaces the directory.

Where merged models live: `<run_dir>/merged/global_step_<N>/` (`merged_model_dir`), outside veRL's
checkpoint tree, because veRL owns that tree: its retention deletes old step directories (a merge kept
inside one would vanish with it, or keep a half-deleted step looking alive), `default_hdfs_dir` uploads whole
step directories (the merged copy would be uploaded too), and eval of a step that retention later removes
still finds its merge.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from longhaul.checkpoints.steps import (
    ACTOR_SUBDIR,
    COMPLETE_NEEDS,
    HF_SUBDIR,
    STEP_PREFIX,
    saved_steps,
    shard_dir,
    tracker_step,
)
from longhaul.layout import MERGED_SUBDIR

#: Where veRL's model merger puts a LoRA adapter inside its output.
LORA_ADAPTER_SUBDIR = "lora_adapter"
#: Provenance of a merged directory (its source shard directory); makes a repeated merge a no-op.
MERGE_RECORD = "longhaul_merge.json"
_MERGING_SUFFIX = ".merging"


class MergeAborted(Exception):  # noqa: N818 - control flow: the caller asked to stop
    """The caller's `abort()` became true during a merge; nothing was left at the target."""


def merged_model_dir(run_dir: str | Path, step: int) -> Path:
    """Where the merged model of `step` lives (module docstring: outside veRL's checkpoint tree)."""
    return Path(run_dir) / MERGED_SUBDIR / f"{STEP_PREFIX}{step}"


def merge_checkpoint(
    checkpoint_dir: str | Path,
    step: int,
    out_dir: str | Path,
    base_model: str | Path | None,
    *,
    component: str | None = ACTOR_SUBDIR,
    abort: Callable[[], bool] | None = None,
) -> Path:
    """Merge complete `step` of `checkpoint_dir` into the Hugging Face directory `out_dir` (returned).

    `base_model`: where the tokenizer comes from if the checkpoint has none (the model training started from).
    A merge of the same source already at `out_dir` is kept as is. Raises FileNotFoundError for an incomplete
    step, RuntimeError when veRL's merger fails, MergeAborted when `abort()` turns true while it runs."""
    src = shard_dir(checkpoint_dir, step, component)
    out = Path(out_dir)
    if _merged_from(out) == str(src.resolve()):
        return out
    if step not in saved_steps(checkpoint_dir, component=component):
        raise FileNotFoundError(
            f"{src}: step {step} is not a complete veRL checkpoint (complete steps: "
            f"{saved_steps(checkpoint_dir, component=component) or 'none'}; tracker: "
            f"{tracker_step(checkpoint_dir)}); {COMPLETE_NEEDS}"
        )
    return _merge_shards(src, out, base_model, abort)


def merge_lora_adapter(
    base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, tokenizer_dir: str | Path | None = None
) -> None:
    """Base model + PEFT LoRA adapter → one merged model saved to `out_dir`, with the tokenizer of
    `tokenizer_dir` (default: the base's)."""
    # deferred: peft and transformers (~2 s)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir or base_dir).save_pretrained(out)


def _merged_from(out: Path) -> str | None:
    """The source recorded in a merged directory, None if `out` is not one."""
    try:
        return json.loads((out / MERGE_RECORD).read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _merge_shards(src: Path, out: Path, base_model: str | Path | None, abort: Callable[[], bool] | None) -> Path:
    work = out.with_name(f".{out.name}{_MERGING_SUFFIX}")
    shutil.rmtree(work, ignore_errors=True)  # an interrupted merge is redone from scratch
    work.mkdir(parents=True)
    try:
        gathered = work / "fsdp"
        _run_model_merger(src, gathered, abort)
        has_tokenizer = (gathered / "tokenizer_config.json").is_file()
        if not has_tokenizer and base_model is None:
            raise FileNotFoundError(f"{src / HF_SUBDIR}: no tokenizer in the checkpoint and no base_model given")
        tokenizer = gathered if has_tokenizer else base_model
        lora = (gathered / LORA_ADAPTER_SUBDIR).is_dir()
        if lora:
            model = work / "model"
            merge_lora_adapter(gathered, gathered / LORA_ADAPTER_SUBDIR, model, tokenizer_dir=tokenizer)
        else:
            model = gathered
            if not has_tokenizer:
                # deferred: transformers (~1 s)
                from transformers import AutoTokenizer

                AutoTokenizer.from_pretrained(base_model).save_pretrained(model)
        (model / MERGE_RECORD).write_text(json.dumps({"source": str(src.resolve()), "lora_merged": lora}) + "\n")
        _fsync_tree(model)
        old = work / "replaced"
        if out.exists():  # a merge of another source (or debris): swapped out, then deleted
            out.rename(old)
        model.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _run_model_merger(src: Path, target: Path, abort: Callable[[], bool] | None) -> None:
    argv = [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(src),
        "--target_dir",
        str(target),
    ]
    log = target.with_name("model_merger.log")
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                if abort is not None and abort():
                    proc.terminate()
                    raise MergeAborted(f"merge of {src} stopped on request")
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(
            f"veRL's model merger failed on {src} (exit {proc.returncode}): "
            f"{' '.join(argv)}\n--- last output ---\n{tail}"
        )


def _fsync_tree(root: Path) -> None:
    """Flush a finished merge to disk before it is renamed into place (a node crash leaves no torn files)."""
    for f in root.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
