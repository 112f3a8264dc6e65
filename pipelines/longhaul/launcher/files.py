"""The run directory's lock: one launcher per run directory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LockBusy(RuntimeError):
    """Another live process holds the lock; the message names it."""


@contextmanager
def exclusive_lock(path: str | Path, what: str) -> Iterator[Path]:
    """Hold an exclusive `flock` on `path` (created if missing; it records the holder's PID) for the `with` block.

    The kernel releases it when the holder dies, however it dies (SIGKILL included), and the descriptor is not
    inherited by child processes, so a killed launcher's leftover children never keep its run locked. Raises
    LockBusy at once when another process holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise LockBusy(
                f"{what} is in use by process {holder} (lock {path}); wait for it to finish or stop "
                f"it — two launchers must never run the same run directory"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # informational only (a full disk must not stop the launcher from reporting it)
            pass
        yield path
    finally:
        os.close(fd)
