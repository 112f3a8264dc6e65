"""Thin I/O adapters that ship rendered runs to a backend: `longhaul.submit.<backend>`.

Every backend module exposes the same three functions, found by name (no if/elif over backends):

- `submit_run(exp, *, dry_run=False) -> result` with `.run_name`, `.run_dir`, `.job_id`, `.script`, `.message`
- `fetch_status(run_dir) -> dict` (JSON-serialisable; includes `job.phase` where the backend has jobs)
- `fetch_logs(run_dir, *, follow=False) -> Iterator[str]`

Submit records `<run_dir>/submit.json` with `"backend": <name>`, so `status` and `logs` find the backend from
the run directory alone. What more than one adapter needs lives here: the submit record, what a run directory says
about progress (`read_run_progress`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from longhaul import bounded
from longhaul.layout import CHECKPOINTS_SUBDIR, DONE_SUFFIX, STAGES_DIR, TRACKER_FILE
from longhaul.layout import RECORD_FILE as RECORD

BACKENDS = ("slurm", "kubernetes", "local")
REQUIRED = ("submit_run", "fetch_status", "fetch_logs")


@dataclass(frozen=True)
class SubmitResult:
    """What a backend's `submit_run` did (or, with `dry_run`, would do)."""

    backend: str
    run_name: str
    run_dir: str
    job_id: str | None
    script: str
    dry_run: bool
    message: str = ""
    script_path: str | None = None
    exit_code: int | None = None


class BackendUnavailable(RuntimeError):
    """The named backend does not exist or its adapter is not installed/complete."""


def get_backend(name: str, *, need: tuple[str, ...] = REQUIRED) -> ModuleType:
    """The adapter module for backend `name`, checked to provide the functions in `need`."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend '{name}'; valid: {', '.join(BACKENDS)}")
    try:
        mod = importlib.import_module(f"longhaul.submit.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"longhaul.submit.{name}":
            raise BackendUnavailable(
                f"backend '{name}' is not available: it needs the module '{exc.name}' "
                f"(install the extra that provides it)"
            ) from exc
        raise BackendUnavailable(
            f"backend '{name}' is not available in this installation (longhaul.submit.{name} is missing)"
        ) from exc
    missing = [fn for fn in need if not callable(getattr(mod, fn, None))]
    if missing:
        raise BackendUnavailable(
            f"backend '{name}' does not support {', '.join(missing)} (longhaul.submit.{name} defines no such function)"
        )
    return mod


def backend_of_run(run_dir: str | Path) -> str:
    """The backend recorded in `<run_dir>/submit.json` by the submit step."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        raise BackendUnavailable(
            f"{run_dir}: not a submitted run directory ({RECORD} missing); "
            "pass the run directory printed by `longhaul submit`"
        )
    backend = read_record(path, {"backend": str})["backend"]
    if backend not in BACKENDS:
        raise BackendUnavailable(f"{path}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    return str(backend)


#: A record's field types: a type or a tuple of them (`float` also takes an int; `bool` is never an int).
FieldTypes = Mapping[str, type | tuple[type, ...]]

#: veRL's tracker file holds one step number.
_MARKER = bounded.Limits("a checkpoint tracker file", max_bytes=64)


class RecordError(RuntimeError):
    """A record file of a run directory (submit.json, exit.json) that is not what longhaul writes there."""


def _has_type(value: Any, types: type | tuple[type, ...]) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types) or (float in types and isinstance(value, int))


def read_record(path: Path, required: FieldTypes, optional: FieldTypes | None = None) -> dict[str, Any]:
    """A JSON record written by longhaul into a run directory (`submit.json`, the exit record), read within
    `bounded.SMALL_JSON` and type-checked: every `required` field present with its type, every `optional` one of
    its type when present (null allowed). Raises `RecordError` naming the file and field (a truncated, edited or
    foreign file), OSError when it cannot be read."""
    fix = "it is written by longhaul: submit the spec again, or remove the run directory"
    try:
        doc = bounded.read_json(path, bounded.SMALL_JSON, expected="the JSON object longhaul writes there")
    except bounded.InputError as exc:
        raise RecordError(f"{exc}; {fix}") from None
    if not isinstance(doc, dict):
        raise RecordError(f"{path}: not a JSON object (got {type(doc).__name__}); {fix}")
    for key, types in {**required, **(optional or {})}.items():
        if key not in doc and key in required:
            raise RecordError(f"{path} {key}: missing; {fix}")
        value = doc.get(key)
        if key in doc and not (value is None and key not in required) and not _has_type(value, types):
            names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise RecordError(f"{path} {key}: must be {names} (got {str(value)[:60]!r}); {fix}")
    return doc


def skipped_note(path: Path, skipped: int) -> str:
    """The line `longhaul logs` prints first when it shows only the end of a long log (`bounded.LOG_TAIL`)."""
    return f"[longhaul logs: the first {skipped:,} bytes of {path} are not shown; the file holds the whole log]\n"


def read_run_progress(run_dir: Path) -> dict[str, object]:
    """Stages finished and the newest checkpoint step, as written by the launcher and the trainer."""
    stages_dir = run_dir / STAGES_DIR
    done = sorted(p.stem for p in stages_dir.glob(f"*{DONE_SUFFIX}")) if stages_dir.is_dir() else []
    step = None
    marker = run_dir / CHECKPOINTS_SUBDIR / TRACKER_FILE
    if marker.is_file():
        try:
            text = bounded.read_text(marker, _MARKER).strip()
        except (OSError, ValueError):  # unreadable, not a regular file, too large, not UTF-8: no step known
            text = ""
        step = int(text) if text.isdigit() and len(text) <= 12 else None
    return {"stages_done": done, "checkpoint_step": step}
