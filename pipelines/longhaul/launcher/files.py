"""Atomic file writes (a temporary file in the same directory, fsync, then rename: readers never see half a file,
and a failed write — a full disk — leaves the previous file as it was), and the run directory's lock."""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; parent directories are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as indented JSON to `path` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


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
            raise LockBusy(f"{what} is in use by process {holder} (lock {path}); wait for it to finish or stop "
                           f"it — two launchers must never run the same run directory") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:  # informational only (a full disk must not stop the launcher from reporting it)
            pass
        yield path
    finally:
        os.close(fd)
