"""Bounded reads of one local file (I/O): whole files, JSON and JSON Lines, already-built data, task-id lists and
the tail of a log. Files are read at most one byte past their limit, JSONL lines at most one byte past theirs;
anything but a regular file is refused before it is read (it could block forever)."""

from __future__ import annotations

import codecs
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longhaul.bounded.limits import LOG_TAIL, TASK_IDS, InputError, Limits, MiB, dotted_path, format_size

# ---------------------------------------------------------------------------------------------------------
# Whole files


def open_regular(path: str | Path, limits: Limits) -> Any:
    """`path` opened for binary reading if it is a regular file (or a link to one); anything else — a FIFO, a
    device, a socket — is refused at once: reading one would block until some other process writes to it.

    The file is opened non-blocking (opening a FIFO waits for a writer otherwise), checked, then set back to
    blocking. OSError (missing file, a directory, permissions) propagates for the caller to word.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(21, "Is a directory", str(path))
        if not stat.S_ISREG(mode):
            raise InputError(
                str(path), None, "", "not a regular file (a pipe, device or socket): reading it could wait forever",
                hint=f"give {limits.kind} as a file",
            )  # fmt: skip
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | Path, limits: Limits) -> str:
    """The UTF-8 text of a regular file no larger than `limits.max_bytes`; never reads more than one byte past it.

    OSError (missing file, a directory, permissions) propagates for the caller to word.
    """
    with open_regular(path, limits) as fh:
        _refuse_if_oversized(fh, path, limits)
        data = fh.read(limits.max_bytes + 1)  # a growing file: the read itself is bounded
    if len(data) > limits.max_bytes:
        raise too_large(path, data.count(b"\n", 0, limits.max_bytes) + 1, limits)
    return _decode(data, path, 1)


def _refuse_if_oversized(fh: Any, path: str | Path, limits: Limits) -> None:
    """Refuse a regular file whose size already says it is too large, naming the line where the limit falls
    (counted in 1 MiB chunks: memory stays flat whatever the file's size)."""
    st = os.fstat(fh.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_size <= limits.max_bytes:
        return
    line, left = 1, limits.max_bytes
    while left > 0:
        chunk = fh.read(min(MiB, left))
        if not chunk:
            break
        line += chunk.count(b"\n")
        left -= len(chunk)
    raise too_large(path, line, limits, st.st_size)


def too_large(path: str | Path, line: int, limits: Limits, size: int | None = None) -> InputError:
    """The error for a file over `limits.max_bytes`, naming the line where the limit falls."""
    got = f"{size:,} bytes" if size is not None else f"more than {limits.max_bytes:,} bytes"
    return InputError(
        str(path),
        line,
        "",
        f"file is larger than the {format_size(limits.max_bytes)} limit of "
        f"{limits.kind} ({got}; the limit is reached on this line)",
        hint=limits.hint,
    )


def _decode(data: bytes, path: str | Path, first_line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        raise InputError(
            str(path), line, "", f"not UTF-8 text ({exc.reason} at byte {exc.start})", hint="save the file as UTF-8"
        ) from None


# ---------------------------------------------------------------------------------------------------------
# JSON and JSON Lines


def read_jsonl(
    path: str | Path, limits: Limits, *, expected: str = "one JSON record per line"
) -> list[tuple[int, Any]]:
    """(line number, value) of every non-blank line of a JSON Lines file, read line by line with every bound
    of `limits` checked before the line is decoded."""
    out: list[tuple[int, Any]] = []
    max_line = limits.max_record_bytes or limits.max_bytes
    total = 0
    with open_regular(path, limits) as fh:
        _refuse_if_oversized(fh, path, limits)
        lineno = 0
        while raw := fh.readline(max_line + 1):
            lineno += 1
            total += len(raw)
            if total > limits.max_bytes:
                raise too_large(path, lineno, limits)
            if len(raw) > max_line and not (len(raw) == max_line + 1 and raw.endswith(b"\n")):
                raise InputError(
                    str(path),
                    lineno,
                    "",
                    f"line is longer than the {format_size(max_line)} limit of {limits.kind}",
                    hint=f"expected {expected}; {limits.hint}",
                )
            if not raw.strip():
                continue
            if limits.max_records is not None and len(out) >= limits.max_records:
                raise _too_many(path, lineno, limits)
            out.append((lineno, _loads(_decode(raw, path, lineno), path, lineno, limits, expected)))
    return out


def read_json_records(path: str | Path, limits: Limits, *, expected: str = "one JSON record per line") -> list[Any]:
    """The items of a file holding one JSON value (a list gives its items, anything else is one item) or JSON
    Lines (one value per line)."""
    text = read_text(path, limits)
    try:
        data = json.loads(text)
    except ValueError:  # not one JSON value (or a number past the conversion limit): JSON Lines, line by line
        del text
        return [v for _, v in read_jsonl(path, limits, expected=expected)]
    except RecursionError:
        raise _too_deep_json(path, None, limits) from None
    items = data if isinstance(data, list) else [data]
    if limits.max_records is not None and len(items) > limits.max_records:
        raise _too_many(path, None, limits, len(items))
    for i, item in enumerate(items):
        check_data(item, str(path), limits, line=None, root=(i,) if isinstance(data, list) else ())
    return items


def read_json(path: str | Path, limits: Limits, *, expected: str = "a JSON object") -> Any:
    """The one JSON value of a regular file within `limits` (size, nesting); `InputError` names the file, the line
    and what was expected. OSError (missing file, a directory, permissions) propagates for the caller to word."""
    return _loads(read_text(path, limits), path, None, limits, expected)


def _loads(text: str, path: str | Path, lineno: int | None, limits: Limits, expected: str) -> Any:
    """`text` (line `lineno` of a JSONL file, or a whole file: None) parsed and held to `limits`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        at = exc.lineno if lineno is None else lineno
        raise InputError(str(path), at, "", f"not JSON ({exc.msg})", hint=f"expected {expected}") from None
    except RecursionError:
        raise _too_deep_json(path, lineno, limits) from None
    except ValueError as exc:  # an integer past Python's 4,300-digit conversion limit
        raise InputError(
            str(path), lineno, "", f"not JSON a reader can take ({exc})", hint=f"expected {expected}"
        ) from None
    check_data(value, str(path), limits, line=lineno)
    return value


def _too_many(path: str | Path, line: int | None, limits: Limits, got: int | None = None) -> InputError:
    n = f"{got:,}" if got is not None else f"more than {limits.max_records:,}"
    return InputError(
        str(path), line, "", f"{n} records, over the {limits.max_records:,} limit of {limits.kind}", hint=limits.hint
    )


def _too_deep_json(path: str | Path, line: int | None, limits: Limits) -> InputError:
    return InputError(
        str(path),
        line,
        "",
        f"nested deeper than the {limits.max_depth} levels allowed in {limits.kind}",
        hint="records are flat objects with a few nested lists; check the file",
    )


# ---------------------------------------------------------------------------------------------------------
# Already-built data (the operator receives Experiments as JSON from the API server)


def check_data(data: Any, file: str, limits: Limits, *, line: int | None = None, root: tuple[Any, ...] = ()) -> None:
    """Refuse data nested deeper than `limits.max_depth` or with more than `limits.max_nodes` values.

    Iterative (a hostile depth cannot exhaust the stack); visits containers only, so the cost is the number
    of dicts and lists.
    """
    nodes = 1
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(data, 1, root)]
    while stack:
        value, depth, loc = stack.pop()
        if not isinstance(value, dict | list):
            continue
        if depth > limits.max_depth:
            raise InputError(
                file,
                line,
                dotted_path(loc),
                f"nested deeper than the {limits.max_depth} levels allowed in {limits.kind}",
                hint="flatten the data",
            )
        nodes += len(value)
        if limits.max_nodes is not None and nodes > limits.max_nodes:
            raise InputError(
                file,
                line,
                dotted_path(loc),
                f"more than {limits.max_nodes:,} values in {limits.kind}",
                hint=limits.hint,
            )
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((v, depth + 1, (*loc, k)) for k, v in items if isinstance(v, dict | list))


# ---------------------------------------------------------------------------------------------------------
# Task-id lists


def split_ids(text: str, what: str = "--tasks", limits: Limits = TASK_IDS) -> list[str]:
    """Comma-separated ids, blanks dropped; refuses too many ids or over-long ones before splitting."""
    if len(text) > limits.max_bytes:
        raise InputError(
            what,
            None,
            "",
            f"{len(text):,} characters, over the {format_size(limits.max_bytes)} limit of {limits.kind}",
            hint=limits.hint,
        )
    n = text.count(",") + 1
    if limits.max_records is not None and n > limits.max_records:
        raise InputError(
            what, None, "", f"{n:,} ids, over the {limits.max_records:,} limit of {limits.kind}", hint=limits.hint
        )
    ids = [t.strip() for t in text.split(",") if t.strip()]
    for t in ids:
        if limits.max_record_bytes is not None and len(t) > limits.max_record_bytes:
            raise InputError(
                what,
                None,
                "",
                f"a task id longer than {limits.max_record_bytes} characters",
                t[:40] + "…",
                hint="task ids are short, e.g. 0,12,37",
            )
    return ids


# ---------------------------------------------------------------------------------------------------------
# Logs: the tail of a file that may be huge and may still grow


def tail_start(path: str | Path, limits: Limits = LOG_TAIL) -> int:
    """The offset where the last `limits.max_bytes` of the regular file `path` begin (0 for a smaller file)."""
    with open_regular(path, limits) as fh:
        return max(0, os.fstat(fh.fileno()).st_size - limits.max_bytes)


def read_from(path: str | Path, pos: int, limits: Limits = LOG_TAIL) -> Iterator[tuple[str, int]]:
    """The text of the regular file `path` from byte `pos` to its current end, in chunks of at most
    `limits.max_record_bytes` (undecodable bytes replaced), each with the offset after it: memory stays flat
    however large the file, and a file still being written is read up to where it ends now."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open_regular(path, limits) as fh:
        fh.seek(pos)
        while data := fh.read(limits.max_record_bytes or MiB):
            pos += len(data)
            yield decoder.decode(data), pos
