"""Local backend (thin I/O): run the launcher on this machine, in this process.

The run directory is `<spec.backends.local.output_dir>/<run_name>`; it gets the resolved spec
(`experiment.yaml`), `submit.json` (so `longhaul status/logs` find the backend), the launcher's output in
`logs/launcher.log` and the exit record `.longhaul/exit.json`. The same spec resumes the same run directory and
MLflow run. The vLLM servers run on this interpreter (its venv holds vLLM's CPU build beside veRL) unless
`$LONGHAUL_VLLM_PYTHON` names another.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO

from longhaul import bounded
from longhaul import constants as C
from longhaul.files import atomic_write_json, atomic_write_text
from longhaul.k8s.status import Phase
from longhaul.launcher.supervisor import launch
from longhaul.layout import EXIT_RECORD_FILE, LAUNCHER_LOG, LOGS_SUBDIR, default_run_dir
from longhaul.layout import RECORD_FILE as RECORD
from longhaul.protocol import EXIT_KILLED, EXIT_OK, EXIT_REQUEUE, EXIT_SIGINT
from longhaul.render.plan import render_plan, stage_refusal
from longhaul.spec.models import Experiment, resolved_yaml
from longhaul.spec.naming import run_name, seed_group, seed_runs
from longhaul.submit import SubmitResult, read_record, read_run_progress, skipped_note


def local_run_dir(exp: Experiment, base: str | Path | None = None) -> Path:
    """`<output_dir>/<run_name>` (relative to `base`, default the working directory)."""
    return Path(base or ".") / default_run_dir(exp, "local")


class _Tee:
    """Write to the terminal and to the run's launcher log."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()

    def isatty(self) -> bool:
        return False


def run_local(
    exp: Experiment,
    *,
    run_dir: str | Path | None = None,
    stage: str | None = None,
    environ: Mapping[str, str] | None = None,
    echo: TextIO | None = None,
) -> tuple[Path, int]:
    """Run `exp` on this machine; returns (run directory, launcher exit code)."""
    env = dict(os.environ if environ is None else environ)
    run_dir = Path(run_dir) if run_dir else local_run_dir(exp)
    run_dir.mkdir(parents=True, exist_ok=True)
    group = seed_group(exp)
    if group is not None:  # the seed runs' shared MLflow store lives there (longhaul.tracking.config)
        (run_dir.absolute().parent / group).mkdir(exist_ok=True)
    spec_file = run_dir / C.SPEC_FILENAME
    atomic_write_text(spec_file, resolved_yaml(exp))
    record = {
        "backend": "local",
        "run_name": run_name(exp),
        "run_dir": str(run_dir.absolute()),
        "pid": os.getpid(),
        "started": time.time(),
        "stage": stage,
    }
    atomic_write_json(run_dir / RECORD, record)
    (run_dir / LOGS_SUBDIR).mkdir(exist_ok=True)
    with open(run_dir / LAUNCHER_LOG, "a", encoding="utf-8") as log:
        rc = launch(spec_file, "local", run_dir, stage=stage, environ=env, echo=_Tee(echo or sys.stdout, log))
    atomic_write_json(run_dir / EXIT_RECORD_FILE, {"exit_code": rc, "finished": time.time()})
    return run_dir, rc


def run_local_seeds(
    exp: Experiment,
    *,
    run_dir: str | Path | None = None,
    stage: str | None = None,
    environ: Mapping[str, str] | None = None,
    echo: TextIO | None = None,
) -> list[tuple[Path, int]]:
    """Run every seed run of `exp` (`longhaul.spec.seed_runs`) one after another, stopping at the first that does
    not finish (its exit code is the last entry); the same spec resumes each. `run_dir` only for a single run."""
    refusal = stage_refusal(exp, stage)
    if refusal:  # before any run directory is written
        raise ValueError(refusal)
    runs = seed_runs(exp)
    if run_dir is not None and len(runs) > 1:
        raise ValueError(
            f"--run-dir names one run; this spec has {len(runs)} training seeds, each in "
            f"<backends.local.output_dir>/<run>-s<seed>: drop --run-dir"
        )
    done: list[tuple[Path, int]] = []
    for r in runs:
        if len(runs) > 1:
            (echo or sys.stdout).write(
                f"== seed {r.spec.algorithm.seed}: run {run_name(r)} ({len(done) + 1}/{len(runs)})\n"
            )
        done.append(run_local(r, run_dir=run_dir, stage=stage, environ=environ, echo=echo))
        if done[-1][1] != EXIT_OK:
            break
    return done


def submit_run(exp: Experiment, *, dry_run: bool = False) -> SubmitResult:
    """`longhaul submit --backend local`: run now, in this process (blocks until every seed run ends)."""
    runs = seed_runs(exp)
    name = run_name(exp)
    if dry_run:
        plans = [render_plan(r, "local", str(local_run_dir(r).absolute())).to_dict() for r in runs]
        return SubmitResult(
            "local",
            name,
            str(local_run_dir(runs[0])),
            None,
            json.dumps(plans[0] if len(plans) == 1 else plans, indent=2),
            True,
            "dry run: nothing started",
        )
    results = run_local_seeds(exp)
    run_dir, rc = results[-1]
    ran = ", ".join(f"{p.name}: exit {code}" for p, code in results)
    return SubmitResult(
        "local",
        name,
        str(run_dir),
        str(os.getpid()),
        "",
        False,
        f"local run finished with exit code {rc}"
        if len(runs) == 1
        else f"{len(results)}/{len(runs)} seed runs ran ({ran})",
        exit_code=rc,
    )


#: Launcher exit code → phase; any other exit code is Failed.
PHASES = {EXIT_OK: Phase.SUCCEEDED, EXIT_REQUEUE: Phase.PENDING, EXIT_KILLED: Phase.FAILED, EXIT_SIGINT: Phase.FAILED}


def fetch_status(run_dir: str | Path) -> dict[str, object]:
    """Phase of a local run from its records (Running while the recorded process lives)."""
    run_dir = Path(run_dir)
    rec_path = run_dir / RECORD
    if not rec_path.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no local run recorded ({RECORD} missing); start it with `longhaul run SPEC`"
        )
    record = read_record(rec_path, {"backend": str}, {"run_name": str, "pid": int, "started": float})
    exit_path = run_dir / EXIT_RECORD_FILE
    exit_rec = read_record(exit_path, {"exit_code": int, "finished": float}) if exit_path.is_file() else None
    if exit_rec and exit_rec["finished"] >= (record.get("started") or 0):
        rc = exit_rec["exit_code"]
        phase, state = PHASES.get(rc, Phase.FAILED), f"exit {rc}"
    elif _alive(record.get("pid") or 0):
        phase, state = Phase.RUNNING, "running"
    else:
        phase, state = Phase.FAILED, "process gone without an exit record"
    return {
        "run_name": record.get("run_name"),
        "run_dir": str(run_dir),
        "backend": "local",
        "job": {"phase": phase, "state": state, "pid": record.get("pid")},
        **read_run_progress(run_dir),
    }


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fetch_logs(run_dir: str | Path, *, follow: bool = False, poll_s: float = 0.5) -> Iterator[str]:
    """The launcher log of a local run (all attempts appended): its last `bounded.LOG_TAIL` bytes (a first line
    says how much is left out), then, with `follow`, what is appended while the run lives."""
    path = Path(run_dir) / LAUNCHER_LOG
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no launcher log yet")
    pos = bounded.tail_start(path)  # refuses a pipe or device where the log should be
    if pos:
        yield skipped_note(path, pos)
    while True:
        before = pos
        for chunk, end in bounded.read_from(path, pos):
            pos = end
            yield chunk
        if pos != before:
            continue
        if not follow or fetch_status(run_dir)["job"]["phase"] != Phase.RUNNING:
            return
        time.sleep(poll_s)
