"""The steps of a veRL checkpoint directory (I/O): which are complete, and making veRL resume from one.

The layout is described in `longhaul.checkpoints`.

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
"""

from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from longhaul.files import atomic_write_text
from longhaul.layout import TRACKER_FILE

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
COMPLETE_NEEDS = (
    f"a complete step needs {FSDP_CONFIG_FILE}, whole model/optim/extra_state shards of every rank, "
    f"{HF_SUBDIR}/config.json and (main_ppo) {DATALOADER_FILE}, and a tracker not older than it"
)
#: A step directory the tracker recorded but that is incomplete is renamed to `global_step_<N>.incomplete`.
_INCOMPLETE_SUFFIX = ".incomplete"


def step_dir(checkpoint_dir: str | Path, step: int) -> Path:
    """The directory of `step`, `global_step_<N>`."""
    return Path(checkpoint_dir) / f"{STEP_PREFIX}{step}"


def shard_dir(checkpoint_dir: str | Path, step: int, component: str | None = ACTOR_SUBDIR) -> Path:
    """The directory holding the FSDP shards of `step` (`global_step_N/actor`, or `global_step_N` for SFT)."""
    d = step_dir(checkpoint_dir, step)
    return d / component if component else d


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
            f"(steps on disk: {sorted(dirs) or 'none'}; {COMPLETE_NEEDS}). Training was not started, so that "
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
