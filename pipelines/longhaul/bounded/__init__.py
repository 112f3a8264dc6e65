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

The limits and the error are in `longhaul.bounded.limits`, the file readers in `longhaul.bounded.read`, the YAML
composer in `longhaul.bounded.yaml_compose`; readers use them through this package (`bounded.read_text`,
`bounded.SPEC`), which exports every public name.
"""

from longhaul.bounded.limits import (
    LOG_TAIL,
    RESULTS,
    SFT_TRAJECTORIES,
    SMALL_JSON,
    SPEC,
    TASK_IDS,
    TRAJECTORIES,
    InputError,
    KiB,
    Limits,
    MiB,
    dotted_path,
    format_size,
)
from longhaul.bounded.read import (
    check_data,
    open_regular,
    read_from,
    read_json,
    read_json_records,
    read_jsonl,
    read_text,
    split_ids,
    tail_start,
    too_large,
)
from longhaul.bounded.yaml_compose import compose_yaml

__all__ = [
    "LOG_TAIL",
    "RESULTS",
    "SFT_TRAJECTORIES",
    "SMALL_JSON",
    "SPEC",
    "TASK_IDS",
    "TRAJECTORIES",
    "InputError",
    "KiB",
    "Limits",
    "MiB",
    "check_data",
    "compose_yaml",
    "dotted_path",
    "format_size",
    "open_regular",
    "read_from",
    "read_json",
    "read_json_records",
    "read_jsonl",
    "read_text",
    "split_ids",
    "tail_start",
    "too_large",
]
