"""Rollout traces: one JSON line per trajectory, written by the agent-loop worker that ran it.

Layout under the directory named by `$LONGHAUL_ROLLOUT_DIR` (unset: no traces):

    step_<N>/<pid>.jsonl              trajectories of training step N (graded; the group may still be dropped)
    val_step_<N>/<pid>.jsonl          validation after step N (val_step_0: before training)
    step_<N>/failures/<pid>.jsonl     trajectories that failed (`TrajectoryFailed`): their groups were dropped

One file per worker process, whole lines appended under a lock, so writers never interleave. A trajectory line
is `{"trajectory": <the episode runner's record, as evaluation writes it>, "step", "validate", "uid", "session",
"index", "seed", "reward": {...}, "timing": {...}, ...}`, which `longhaul explain` reads as it is. A failure line
has `"trajectory": null`, `"failed": <reason>`, `"error"` and what is known of the episode (`messages` so far, or
the runner's record as `failed_trajectory`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from longhaul import constants as C
from longhaul.agentloop.context import RolloutContext
from longhaul.layout import rollout_step_name

#: Environment variable with the rollout trace directory (set by the launcher; unset: no traces are written).
ROLLOUT_DIR_ENV = C.ENV_ROLLOUT_DIR


def rollout_dir_from_env() -> str | None:
    value = os.environ.get(ROLLOUT_DIR_ENV, "").strip()
    return value or None


def build_trace_path(root: str | Path, ctx: RolloutContext, pid: int, *, failed: bool = False) -> Path:
    """`<root>/[val_]step_<N>/[failures/]<pid>.jsonl` (pure)."""
    step = "unknown" if ctx.step is None else str(ctx.step)
    d = Path(root) / rollout_step_name(step, validation=ctx.validate)
    if failed:
        d = d / "failures"
    return d / f"{pid}.jsonl"


def build_trace_record(ctx: RolloutContext, trajectory: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """One trace line (pure): where the trajectory sits in training, the trajectory itself, and `fields`."""
    return {
        "step": ctx.step,
        "validate": ctx.validate,
        "uid": ctx.uid,
        "index": ctx.index,
        "session": ctx.session,
        "seed": ctx.seed,
        **fields,
        "trajectory": trajectory,
    }


_WRITE_LOCK = threading.Lock()
_UNWRITABLE: set[Path] = set()
logger = logging.getLogger(__name__)


def _append_line(path: Path, record: dict[str, Any]) -> None:
    line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _WRITE_LOCK, path.open("a", encoding="utf-8") as f:
        f.write(line)


async def log_trace(
    root: str | Path, ctx: RolloutContext, record: dict[str, Any], *, failed: bool = False
) -> Path | None:
    """Append `record` to this process's trace file for `ctx`, off the event loop (encoding a long trajectory and
    writing to a network file system must not stall the other episodes of the worker). A trace that cannot be
    written is logged and skipped: it must not fail the trajectory (veRL would drop its group)."""
    path = build_trace_path(root, ctx, os.getpid(), failed=failed)
    try:
        await asyncio.get_running_loop().run_in_executor(None, _append_line, path, record)
    except OSError as exc:
        if path.parent not in _UNWRITABLE:
            _UNWRITABLE.add(path.parent)
            logger.warning(
                "rollout traces: cannot write %s (%s); $%s=%s; skipping traces there", path, exc, ROLLOUT_DIR_ENV, root
            )
        return None
    return path
