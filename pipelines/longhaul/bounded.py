"""Bounded reading of every file a user hands longhaul: Experiment specs (CLI, the launcher in each job, the
operator), results and trajectory JSONL, SFT trajectory files, task-id lists.

All limits live here, one `Limits` per kind of input (`SPEC`, `RESULTS`, `TRAJECTORIES`, `SFT_TRAJECTORIES`,
`TASK_IDS`). Readers call one helper — `read_text`, `read_jsonl`, `read_json_records`, `compose_yaml`,
`split_ids`, `check_data` — and get an `InputError` (a `ValueError`) naming the file, line, dotted field path,
the value and a fix. Hostile input is refused *before* it is built into Python objects: files are read at
most one byte past their limit, JSONL lines at most one byte past theirs, and YAML is composed by a loader
that counts nodes and nesting as the parser emits them and refuses anchors and aliases outright (so an
alias bomb or a recursive alias never expands, and nothing recurses past the depth limit).

Pure apart from reading the one local file it is given: no network, subprocess, clock or randomness.

Size: over 400 lines because one bounded reader per kind of input file, sharing the same limits and error format.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Limits:
    """Bounds for one kind of user input.

    `max_bytes`: the whole file (or text). `max_record_bytes` / `max_records`: one JSONL line (one task id)
    and how many of them. `max_depth`: nesting of mappings/lists (YAML nodes or JSON containers; the top level
    is 1). `max_nodes`: YAML nodes — keys, values and list items — in one document (None: not counted).
    `hint`: what to do when a file is too large.
    """

    kind: str  # for messages, with its article: "an Experiment spec"
    max_bytes: int
    max_depth: int = 64
    max_nodes: int | None = None
    max_record_bytes: int | None = None
    max_records: int | None = None
    hint: str = ""


#: Experiment YAML. Shipped specs are 2-3 KB (3.5 KB resolved), ~330 nodes, 6 levels deep. 64 KiB (18x), 5,000
#: nodes (15x: room for explicit train/test lists of thousands of task ids) and 32 levels keep the worst case
#: well under a second: PyYAML's pure-Python parser spends ~2 µs a character and ~30-50 µs a node.
SPEC = Limits(
    "an Experiment spec",
    max_bytes=64 * KiB,
    max_depth=32,
    max_nodes=5_000,
    hint="an Experiment needs a few KB (the shipped ones are 2-3 KB); check that this is the file you meant",
)

#: `longhaul eval summarize` input: one small record per trial (task id, trial, success, subsets; < 2 KB).
#: 200,000 trials is 4,000 tasks x 50 trials; 1 MiB per line is 500x a record.
RESULTS = Limits(
    "a results JSONL file",
    max_bytes=64 * MiB,
    max_record_bytes=1 * MiB,
    max_records=200_000,
    hint="summarize one evaluation's results.jsonl at a time",
)

#: `longhaul explain` input: whole episodes (system prompt and tool schemas ~18 KB, plus every turn).
TRAJECTORIES = Limits(
    "a trajectory file",
    max_bytes=64 * MiB,
    max_record_bytes=16 * MiB,
    max_records=100_000,
    hint="split it or pass fewer records (a step's directory, or single files)",
)

#: `longhaul sft build-dataset` input: teacher trajectories, one episode (~20-100 KB) per line.
SFT_TRAJECTORIES = Limits(
    "an SFT trajectories JSONL file",
    max_bytes=256 * MiB,
    max_record_bytes=4 * MiB,
    max_records=100_000,
    hint="build the dataset from fewer trajectories (one collection run's trajectories.jsonl)",
)

#: Small JSON side files read back from run directories (dataset stats, summaries, submit records) and models'
#: config.json.
SMALL_JSON = Limits("a JSON side file", max_bytes=4 * MiB, hint="this file is written by longhaul; regenerate it")

#: `longhaul logs`: the last 8 MiB of a job log are shown (a note says how much is left out), read 1 MiB at a time.
LOG_TAIL = Limits("a job log", max_bytes=8 * MiB, max_record_bytes=1 * MiB, hint="the file holds the whole log")

#: `--tasks 1,2,3`: τ² airline has 50 tasks; 10,000 leaves room for larger domains. Ids are short strings.
TASK_IDS = Limits(
    "a task-id list",
    max_bytes=1 * MiB,
    max_record_bytes=64,
    max_records=10_000,
    hint="pass fewer ids, or a subset of the split with --subset",
)

_ANCHOR_HINT = (
    "write the value out in full: anchors (&name), aliases (*name) and merge keys (<<) are refused "
    "because a few lines of them can expand into gigabytes; Kubernetes manifests never need them"
)


class InputError(ValueError):
    """A user file refused: too large, too deep, too many records, an alias, not UTF-8, not JSON."""

    def __init__(
        self, file: str, line: int | None, path: str, message: str, value: Any = None, hint: str | None = None
    ) -> None:
        self.file, self.line, self.path, self.message, self.value, self.hint = file, line, path, message, value, hint
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}{f' {self.path}' if self.path else ''}: {self.message}"
        if self.value is not None:
            text += f" (got {self.value!r})"
        return text + (f"; {self.hint}" if self.hint else "")


def dotted_path(loc: Iterable[Any]) -> str:
    """`spec.algorithm.k[2]` from ('spec', 'algorithm', 'k', 2)."""
    parts: list[str] = []
    for p in loc:
        parts.append(f"[{p}]" if isinstance(p, int) else ("." if parts else "") + str(p))
    return "".join(parts)


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n / KiB:g} KiB" if n >= KiB else f"{n} bytes"


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
        raise _too_large(path, data.count(b"\n", 0, limits.max_bytes) + 1, limits)
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
    raise _too_large(path, line, limits, st.st_size)


def _too_large(path: str | Path, line: int, limits: Limits, size: int | None = None) -> InputError:
    got = f"{size:,} bytes" if size is not None else f"more than {limits.max_bytes:,} bytes"
    return InputError(
        str(path),
        line,
        "",
        f"file is larger than the {_size(limits.max_bytes)} limit of "
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
                raise _too_large(path, lineno, limits)
            if len(raw) > max_line and not (len(raw) == max_line + 1 and raw.endswith(b"\n")):
                raise InputError(
                    str(path),
                    lineno,
                    "",
                    f"line is longer than the {_size(max_line)} limit of {limits.kind}",
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
# YAML


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a composer that checks every node before composing it: anchors and aliases
    are refused, nodes are counted, nesting is bounded. The parser is lazy and iterative, so a refusal happens
    as soon as the offending event is read and no node is built past a limit."""

    def __init__(self, text: str, file: str, limits: Limits) -> None:
        super().__init__(text)
        self._file, self._limits = file, limits
        self._nodes = 0
        self._depth = 0  # counted, not taken from the path: nested complex keys (`? ? ? a`) do not extend it
        self._loc: tuple[Any, ...] = ()

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's signature
        # The scanner looks ahead across a whole line of `[[[[…` (each could start a key) and keeps one
        # possible key per flow level: bound the level here, or the look-ahead is quadratic in it.
        if self.flow_level >= self._limits.max_depth:
            raise InputError(
                self._file,
                self.line + 1,
                "",
                f"flow collections ([ or {{) nested deeper than the "
                f"{self._limits.max_depth} levels allowed in {self._limits.kind}",
                hint="flatten the document; a spec is about 6 levels deep",
            )
        super().fetch_flow_collection_start(TokenClass)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(index, yaml.ScalarNode):
            loc = (*self._loc, index.value)
        elif isinstance(index, int) and not isinstance(index, bool):
            loc = (*self._loc, index)
        else:  # the document root, or a mapping key
            loc = self._loc
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise InputError(
                self._file, line, dotted_path(loc), "YAML aliases are not allowed", f"*{event.anchor}", _ANCHOR_HINT
            )
        if event.anchor is not None:
            raise InputError(
                self._file, line, dotted_path(loc), "YAML anchors are not allowed", f"&{event.anchor}", _ANCHOR_HINT
            )
        self._nodes += 1
        if self._limits.max_nodes is not None and self._nodes > self._limits.max_nodes:
            raise InputError(
                self._file,
                line,
                dotted_path(loc),
                f"more than {self._limits.max_nodes:,} YAML nodes (keys, values, list items) in {self._limits.kind}",
                hint=self._limits.hint,
            )
        if self._depth >= self._limits.max_depth:
            raise InputError(
                self._file,
                line,
                dotted_path(loc),
                f"nested deeper than the {self._limits.max_depth} levels allowed in {self._limits.kind}",
                hint="flatten the document; a spec is about 6 levels deep",
            )
        saved, self._loc = self._loc, loc
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._loc = saved
            self._depth -= 1


def compose_yaml(text: str, file: str, limits: Limits) -> yaml.Node | None:
    """The node tree of a one-document YAML text (None when empty), composed with every bound of `limits`.

    Raises `InputError` for a limit or a second document, `yaml.YAMLError` for invalid YAML.
    """
    if len(text) > limits.max_bytes or len(text.encode("utf-8")) > limits.max_bytes:
        line = text.encode("utf-8")[: limits.max_bytes].count(b"\n") + 1
        raise _too_large(file, line, limits)
    loader = _BoundedLoader(text, file, limits)
    try:
        node = loader.get_node() if loader.check_node() else None
        if node is not None and loader.check_node():
            mark = loader.peek_event().start_mark
            raise InputError(
                file,
                mark.line + 1,
                "",
                "expected one YAML document, found a second one",
                hint="put each Experiment in its own file",
            )
        return node
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------------------------
# Task-id lists


def split_ids(text: str, what: str = "--tasks", limits: Limits = TASK_IDS) -> list[str]:
    """Comma-separated ids, blanks dropped; refuses too many ids or over-long ones before splitting."""
    if len(text) > limits.max_bytes:
        raise InputError(
            what,
            None,
            "",
            f"{len(text):,} characters, over the {_size(limits.max_bytes)} limit of {limits.kind}",
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
