"""Atomic file writes (I/O): a temporary file in the same directory, fsync, then rename, so readers never see half
a file and a failed write (a full disk) leaves the previous file as it was.

`atomic_write_bytes` / `_text` / `_json` write what is in memory; `atomic_output` hands a writer that needs a file
name of its own (pyarrow, a JSONL appended to while episodes run) the temporary file, and publishes it the same way.

A leaf module below every layer: the launcher, the checkpoint tools, the submit adapters and the CLI all write
files that others read while they change.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: The mode of a run's own files: readable by the user only (what `tempfile.mkstemp` gives).
PRIVATE = 0o600
#: The mode a plain `open(path, "w")` asks for; the umask then decides (rendered files, submit records).
PLAIN = 0o666


def _create_temp(path: Path, mode: int) -> tuple[int, Path]:
    """A new, exclusively created temporary file next to `path` (the umask applies to `mode`)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), tmp
        except FileExistsError:
            continue


def atomic_write_bytes(path: str | Path, data: bytes, *, mode: int = PRIVATE) -> Path:
    """Write `data` to `path` atomically, as a file of `mode` (less the umask); parent directories are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextmanager
def atomic_output(path: str | Path, *, mode: int = PRIVATE) -> Iterator[Path]:
    """A new, empty temporary file next to `path` (a file of `mode` less the umask; parent directories are created)
    for the `with` block to write by name; when the block ends it is flushed to disk and renamed onto `path`, when
    the block raises it is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path, mode)
    os.close(fd)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str, *, mode: int = PRIVATE) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write `obj` as indented JSON to `path` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
