"""The limits of every kind of user input, and the error a refused input raises (naming file, line, field, value
and a fix)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

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


def format_size(n: int) -> str:
    """A byte count for messages: `64 KiB`, `1 MiB`, `64 bytes`."""
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n / KiB:g} KiB" if n >= KiB else f"{n} bytes"
