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
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

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
    backend = json.loads(path.read_text(encoding="utf-8")).get("backend")
    if backend not in BACKENDS:
        raise BackendUnavailable(f"{path}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    return str(backend)


def read_run_progress(run_dir: Path) -> dict[str, object]:
    """Stages finished and the newest checkpoint step, as written by the launcher and the trainer."""
    stages_dir = run_dir / STAGES_DIR
    done = sorted(p.stem for p in stages_dir.glob(f"*{DONE_SUFFIX}")) if stages_dir.is_dir() else []
    step = None
    marker = run_dir / CHECKPOINTS_SUBDIR / TRACKER_FILE
    if marker.is_file():
        text = marker.read_text(encoding="utf-8").strip()
        step = int(text) if text.isdigit() else None
    return {"stages_done": done, "checkpoint_step": step}
