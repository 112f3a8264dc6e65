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

A step is *complete* when (the one definition: `step_complete`, used by everything that lists checkpoints —
`saved_steps`, `latest_step`, the merge, evaluation, the SFT export, and `prepare_resume`, which makes veRL's own
resume agree):

1. it is not newer than the tracker file. veRL's trainer writes the tracker after all of a step's files
   (`_save_checkpoint`: actor shards → `data.pt` → tracker), so a newer step directory is a save in progress or
   one cut short; no tracker, no complete step;
2. `fsdp_config.json` names a world size W (veRL writes it on rank 0 after rank 0's shards and `huggingface/`);
3. for every rank R < W, `model_…`, `optim_…` and `extra_state_world_size_W_rank_R.pt` are whole files — what
   veRL's resume loads (longhaul keeps veRL's default `checkpoint.save_contents`: model, optimizer, extra). In the
   SFT layout, which longhaul only exports, the model's shards are required and the others must be whole for
   every rank or absent for all. *Whole* (`file_whole`): non-empty, and a zip archive (torch.save's format)
   whose central directory — written last — is readable, so a file cut at any byte is refused; a file in
   torch's legacy (non-zip) format can only be checked for being non-empty;
4. `huggingface/config.json` parses (the merger needs it);
5. `main_ppo` layout only: `global_step_<N>/data.pt` (the dataloader state, written after the actor's files and
   before the tracker) is whole.

A save cut at any byte (SIGKILL, node loss, a full disk) therefore leaves a step that is not complete, whatever
the tracker says. Retention (`max_actor_ckpt_to_keep`) deletes old `actor/` directories, which makes those steps
incomplete, as they are.

Resuming (`prepare_resume`, run by the launcher before every start of the veRL stage): veRL 0.9.1 resumes from
the step the tracker names (`find_latest_ckpt_path`, `trainer.resume_mode=auto`), without checking its files.
`prepare_resume` makes the tracker name the newest complete step before veRL starts: a tracker cut short by a
kill (empty or garbage; veRL's `open(…, "w")` truncates first) is rewritten to the newest step whose files are all
whole, a tracker naming an incomplete step falls back to the newest complete step before it, and every step
directory after the resume step is moved out of the way, so that veRL's next save of that step does not mix its
files with older ones: one never recorded in the tracker whose files are not whole (a save cut short) is removed;
any other (recorded but incomplete, or whole but never recorded) is kept, renamed `global_step_<N>.incomplete`.
When a tracker exists but no complete step does (up to the tracker's step), it refuses with a clear error rather
than let training silently restart from scratch. Without a tracker veRL trains from scratch, as it would anyway.

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

Size: over 400 lines because veRL's checkpoint layout, the completeness rules and the merge are one protocol, read
together.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from longhaul.files import atomic_write_text
from longhaul.layout import MERGED_SUBDIR, TRACKER_FILE

#: Step directories are `global_step_<N>` (veRL's trainers and `find_latest_ckpt_path`).
STEP_PREFIX = "global_step_"
#: The policy's shard directory inside a `main_ppo` step directory.
ACTOR_SUBDIR = "actor"
#: Config + tokenizer that veRL's checkpoint manager saves beside the shards (read by the merger).
HF_SUBDIR = "huggingface"
#: Written by veRL's FSDP checkpoint manager: `{"FSDP_version": …, "world_size": W}`.
FSDP_CONFIG_FILE = "fsdp_config.json"
#: Kinds of FSDP shard files (`<kind>_world_size_<W>_rank_<R>.pt`), in the order veRL writes them.
SHARD_KINDS = ("model", "optim", "extra_state")
#: The dataloader state `main_ppo` writes in the step directory after the actor's files (before the tracker).
DATALOADER_FILE = "data.pt"
#: What a complete step needs, for error messages (module docstring).
_COMPLETE_NEEDS = (
    f"a complete step needs {FSDP_CONFIG_FILE}, whole model/optim/extra_state shards of every rank, "
    f"{HF_SUBDIR}/config.json and (main_ppo) {DATALOADER_FILE}, and a tracker not older than it"
)
#: A step directory the tracker recorded but that is incomplete is renamed to `global_step_<N>.incomplete`.
_INCOMPLETE_SUFFIX = ".incomplete"
#: Where veRL's model merger puts a LoRA adapter inside its output.
LORA_ADAPTER_SUBDIR = "lora_adapter"
#: Provenance of a merged directory (its source shard directory); makes a repeated merge a no-op.
MERGE_RECORD = "longhaul_merge.json"
_MERGING_SUFFIX = ".merging"


class MergeAborted(Exception):  # noqa: N818 - control flow: the caller asked to stop
    """The caller's `abort()` became true during a merge; nothing was left at the target."""


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"{STEP_PREFIX}{step}"


def shard_dir(checkpoint_dir: str | Path, step: int, component: str | None = ACTOR_SUBDIR) -> Path:
    """The directory holding the FSDP shards of `step` (`global_step_N/actor`, or `global_step_N` for SFT)."""
    d = step_dir(checkpoint_dir, step)
    return d / component if component else d


def merged_model_dir(run_dir: str | Path, step: int) -> Path:
    """Where the merged model of `step` lives (module docstring: outside veRL's checkpoint tree)."""
    return Path(run_dir) / MERGED_SUBDIR / f"{STEP_PREFIX}{step}"


def tracker_step(checkpoint_dir: str | Path) -> int | None:
    """The step in veRL's tracker file, None if there is none. Raises ValueError when it holds no step number
    (a write cut short; `prepare_resume` repairs it)."""
    tracker = Path(checkpoint_dir) / TRACKER_FILE
    if not tracker.is_file():
        return None
    text = tracker.read_text(errors="replace").strip()
    if not text.isdigit():
        raise ValueError(
            f"{tracker}: expected a step number, found {text!r} (a veRL save cut short? "
            f"`longhaul run` repairs it before training resumes; or write the last complete step "
            f"into it, or remove it to restart training)"
        )
    return int(text)


#: The first bytes of a zip archive (torch.save's format since torch 1.6).
_ZIP_MAGIC = b"PK\x03\x04"


def file_whole(path: str | Path) -> bool:
    """True when `path` is a whole file as far as can be told: non-empty, and when it is (or starts like) a zip
    archive — torch.save's format — its central directory, written last, is readable and every member's data lies
    inside the file. A file in another format (torch's legacy pickle format) only has to be non-empty."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file() or size == 0:
            return False
        with path.open("rb") as fh:
            head = fh.read(len(_ZIP_MAGIC))
    except OSError:
        return False
    if not _ZIP_MAGIC.startswith(head):
        return True  # not (the start of) a zip archive: nothing more to check
    try:
        with zipfile.ZipFile(path) as zf:
            return all(i.header_offset + i.compress_size <= size for i in zf.infolist())
    except (OSError, zipfile.BadZipFile, ValueError, EOFError):
        return False


def _json_file(path: Path) -> object | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def shards_complete(shards: str | Path, required: tuple[str, ...] = SHARD_KINDS[:1]) -> bool:
    """True when `shards` holds a whole FSDP save (conditions 2-4 of the module docstring): the shard kinds in
    `required` whole for every rank, the others whole for every rank or absent for all."""
    shards = Path(shards)
    config = _json_file(shards / FSDP_CONFIG_FILE)
    world_size = config.get("world_size") if isinstance(config, dict) else None
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        return False
    if not isinstance(_json_file(shards / HF_SUBDIR / "config.json"), dict):
        return False
    for kind in SHARD_KINDS:
        files = [shards / f"{kind}_world_size_{world_size}_rank_{rank}.pt" for rank in range(world_size)]
        present = [f for f in files if f.exists()]
        if kind in required or present:
            if len(present) != len(files) or not all(file_whole(f) for f in files):
                return False
    return True


def step_complete(
    checkpoint_dir: str | Path, step: int, *, component: str | None = ACTOR_SUBDIR, bound: int | None = None
) -> bool:
    """Whether `step` under `checkpoint_dir` is a complete checkpoint (module docstring) whose step is at most
    `bound` (the tracker's step; `saved_steps` passes it, `prepare_resume` also checks steps past a torn tracker)."""
    if bound is not None and step > bound:
        return False
    if not shards_complete(
        shard_dir(checkpoint_dir, step, component), required=SHARD_KINDS if component else SHARD_KINDS[:1]
    ):
        return False
    return component is None or file_whole(step_dir(checkpoint_dir, step) / DATALOADER_FILE)


def _step_dirs(root: Path) -> dict[int, Path]:
    """`global_step_<N>` directories under `root` by step (other names, e.g. `.incomplete`, are not steps)."""
    out = {}
    if root.is_dir():
        for d in root.glob(f"{STEP_PREFIX}*"):
            n = d.name[len(STEP_PREFIX) :]
            if n.isdigit() and d.is_dir():
                out[int(n)] = d
    return out


def saved_steps(checkpoint_dir: str | Path, *, component: str | None = ACTOR_SUBDIR) -> list[int]:
    """The complete steps under `checkpoint_dir`, ascending (module docstring)."""
    root = Path(checkpoint_dir)
    newest = tracker_step(root)
    if newest is None:
        return []
    return sorted(n for n in _step_dirs(root) if step_complete(root, n, component=component, bound=newest))


def latest_step(checkpoint_dir: str | Path, *, component: str | None = ACTOR_SUBDIR) -> int | None:
    """The newest complete step (normally the tracker's), None if there is none."""
    steps = saved_steps(checkpoint_dir, component=component)
    return steps[-1] if steps else None


class CheckpointError(RuntimeError):
    """The checkpoint directory is in a state training cannot resume from safely; the message says how to fix it."""


@dataclass(frozen=True)
class ResumePoint:
    """What `prepare_resume` found and did: the step veRL resumes from (None: from scratch), the tracker's text
    before, and one line per change made."""

    step: int | None
    tracker_before: str | None
    changes: tuple[str, ...] = ()


def prepare_resume(checkpoint_dir: str | Path, *, component: str | None = ACTOR_SUBDIR) -> ResumePoint:
    """Make veRL's tracker name the newest complete step and clear a save cut short (module docstring).

    Run only while nothing writes to `checkpoint_dir` (the launcher calls it before it starts the trainer)."""
    root = Path(checkpoint_dir)
    tracker = root / TRACKER_FILE
    before = tracker.read_text(errors="replace").strip() if tracker.is_file() else None
    dirs = _step_dirs(root)
    torn = before is not None and not before.isdigit()
    bound = None if torn else (int(before) if before is not None else -1)
    complete = [n for n in sorted(dirs) if step_complete(root, n, component=component, bound=bound)]
    resume = complete[-1] if complete else None
    if resume is None and before is not None:
        raise CheckpointError(
            f"{tracker}: holds {before!r} but no complete checkpoint exists{'' if torn else ' up to that step'} "
            f"(steps on disk: {sorted(dirs) or 'none'}; {_COMPLETE_NEEDS}). Training was not started, so that "
            f"nothing is overwritten: to start over, move {root} away; to resume from a step you repaired, write "
            f"its number into {tracker}"
        )
    changes: list[str] = []
    for n, d in sorted(dirs.items()):
        if resume is not None and n <= resume:
            continue
        recorded = bound is not None and n <= bound
        if not recorded and not step_complete(root, n, component=component):
            shutil.rmtree(d)  # never recorded and not whole: the debris of a save cut short
            changes.append(f"removed {d.name}: a save cut short (not recorded in {TRACKER_FILE}, files not whole)")
        else:  # recorded yet incomplete, or whole but never recorded: kept for inspection, out of veRL's way
            aside = d.with_name(f"{d.name}{_INCOMPLETE_SUFFIX}")
            shutil.rmtree(aside, ignore_errors=True)
            d.rename(aside)
            why = "recorded in the tracker but incomplete" if recorded else "whole but never recorded in the tracker"
            changes.append(f"renamed {d.name} to {aside.name}: {why}")
    if resume is not None and before != str(resume):
        _write_tracker(tracker, resume)
        changes.append(f"{TRACKER_FILE}: {before!r} → {resume}")
    return ResumePoint(resume, before, tuple(changes))


def _write_tracker(tracker: Path, step: int) -> None:
    atomic_write_text(tracker, str(step))


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
            f"{tracker_step(checkpoint_dir)}); {_COMPLETE_NEEDS}"
        )
    return _merge_shards(src, out, base_model, abort)


def merge_lora_adapter(
    base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, tokenizer_dir: str | Path | None = None
) -> None:
    """Base model + PEFT LoRA adapter → one merged model saved to `out_dir`, with the tokenizer of
    `tokenizer_dir` (default: the base's)."""
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
