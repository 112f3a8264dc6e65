"""What the launcher says about the checkpoint filesystem when a run fails: the newest complete checkpoint, whether
the failure looks like a full disk (torch's writer often hides the errno), and what to do about it."""

from __future__ import annotations

import shutil
from pathlib import Path

from longhaul.checkpoints import latest_step, step_dir
from longhaul.launcher.context import StageContext
from longhaul.launcher.processes import NO_SPACE_MARKERS
from longhaul.launcher.stages import StageFailed


def newest_checkpoint(ctx: StageContext) -> str:
    """`step N (<dir>)` or `none`, for failure messages (never raises)."""
    try:
        step = latest_step(ctx.checkpoint_dir)
    except (OSError, ValueError):
        step = None
    return "none" if step is None else f"step {step} ({step_dir(ctx.checkpoint_dir, step)})"


def checkpoint_space(ctx: StageContext) -> tuple[Path, int | None, int | None]:
    """(where, free bytes, bytes of the newest complete checkpoint) for the checkpoint filesystem; never raises."""
    where = ctx.checkpoint_dir if ctx.checkpoint_dir.exists() else ctx.run_dir
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = None
    try:
        step = latest_step(ctx.checkpoint_dir)
        size = (
            None
            if step is None
            else sum(f.stat().st_size for f in step_dir(ctx.checkpoint_dir, step).rglob("*") if f.is_file())
        )
    except (OSError, ValueError):
        size = None
    return where, free, size


#: With less than this free (or less than one checkpoint), a failed save is taken for a full disk.
_LOW_SPACE_BYTES = 16 * 2**20


def looks_like_no_space(exc: BaseException, ctx: StageContext) -> bool:
    """ENOSPC named in the error or the stage's output, or the checkpoint filesystem has less room than one more
    checkpoint (torch's zip writer reports a short write only as `unexpected pos …`, without the errno)."""
    if isinstance(exc, OSError) and exc.errno == 28:
        return True
    if isinstance(exc, StageFailed) and exc.no_space:
        return True
    if any(m in str(exc) for m in NO_SPACE_MARKERS):
        return True
    _, free, size = checkpoint_space(ctx)
    return free is not None and free < max(size or 0, _LOW_SPACE_BYTES)


def disk_full_hint(ctx: StageContext, backend: str) -> str:
    """What to do when the disk under the run directory is full."""
    where, free, size = checkpoint_space(ctx)
    try:
        step = latest_step(ctx.checkpoint_dir)
    except (OSError, ValueError):
        step = None
    room = "free space unknown" if free is None else f"{free / 2**20:.1f} MiB free"
    if size is not None:
        room += f"; one checkpoint takes {size / 2**20:.1f} MiB"
    kept = (
        f"the newest complete checkpoint, step {step}, is intact"
        if step is not None
        else "no complete checkpoint was saved yet"
    )
    again = "`longhaul run SPEC`" if backend == "local" else "`longhaul submit SPEC`"
    return (
        f"no space left on device under the run directory {ctx.run_dir} ({where}: {room}); {kept}. "
        f"Free space there (or point the backend's output_dir at a larger disk), then start the run again "
        f"with {again}: it resumes from {'step ' + str(step) if step is not None else 'the start'}"
    )
