"""Slurm job state and logs (thin I/O): what `longhaul status` and `longhaul logs` show for a Slurm run.

State comes from `scontrol show job -o` (live jobs and MinJobAge after the end), `squeue -h -j ID -o '%T %r'`
when scontrol cannot answer, and accounting last: `sacct` with slurmdbd or, on clusters that only keep a
job-completion log, `sacct -c`. slurmdbd is never required. A job-completion log knows array tasks only by their
raw job id, which each task writes to `<run dir>/slurm-task-job-id`. A job the requeue limit stopped (exit code
79, EXIT_REQUEUE_LIMIT) is reported as "requeue limit reached", with the limit recorded in submit.json.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from longhaul import bounded
from longhaul.k8s.status import Phase
from longhaul.layout import RECORD_FILE as RECORD
from longhaul.render.slurm import EXIT_REQUEUE_LIMIT, TASK_JOB_ID_FILE
from longhaul.submit import read_record, read_run_progress, skipped_note
from longhaul.submit.slurm_cli import Runner, SlurmError, run_slurm

#: Slurm job state → (longhaul phase, terminal?). Phases are the Experiment CRD's status phases.
PHASES: dict[str, tuple[Phase, bool]] = {
    "PENDING": (Phase.PENDING, False),
    "CONFIGURING": (Phase.PENDING, False),
    "REQUEUED": (Phase.PENDING, False),
    "REQUEUE_FED": (Phase.PENDING, False),
    "REQUEUE_HOLD": (Phase.PENDING, False),
    "RESIZING": (Phase.RUNNING, False),
    "RUNNING": (Phase.RUNNING, False),
    "COMPLETING": (Phase.RUNNING, False),
    "STAGE_OUT": (Phase.RUNNING, False),
    "SIGNALING": (Phase.RUNNING, False),
    "SUSPENDED": (Phase.RUNNING, False),
    "STOPPED": (Phase.RUNNING, False),
    "COMPLETED": (Phase.SUCCEEDED, True),
    "FAILED": (Phase.FAILED, True),
    "TIMEOUT": (Phase.FAILED, True),
    "CANCELLED": (Phase.FAILED, True),
    "OUT_OF_MEMORY": (Phase.FAILED, True),
    "NODE_FAIL": (Phase.FAILED, True),
    "BOOT_FAIL": (Phase.FAILED, True),
    "DEADLINE": (Phase.FAILED, True),
    "SPECIAL_EXIT": (Phase.FAILED, True),
    "REVOKED": (Phase.FAILED, True),
    # PREEMPTED: terminal only when the job is not requeued (see `phase_of`).
    "PREEMPTED": (Phase.FAILED, True),
}


@dataclass
class JobStatus:
    """What `longhaul status` shows for one Slurm job."""

    job_id: str
    state: str
    phase: Phase
    terminal: bool
    reason: str = ""
    exit_code: str = ""
    restarts: int = 0
    source: str = ""
    stdout: str = ""
    details: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def load_record(run_dir: str | Path) -> dict[str, object] | None:
    """The submit record of a run directory, or None when nothing was submitted there."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    return read_record(
        path,
        {"backend": str},
        {"job_id": str, "log": str, "history": list, "run_name": str, "seed": int, "max_requeues": int},
    )


_KV_SPLIT = re.compile(r" (?=[A-Za-z][A-Za-z0-9/:_]*=)")


def parse_scontrol(line: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value, values may contain spaces) as a dict."""
    out: dict[str, str] = {}
    for part in _KV_SPLIT.split(line.strip()):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value
    return out


def phase_of(state: str, requeue: bool = True) -> tuple[Phase, bool]:
    """(phase, terminal) for a Slurm state; PREEMPTED is a pause when the job will be requeued."""
    base = state.split()[0].rstrip("+").upper() if state else ""
    if base == "PREEMPTED" and requeue:
        return Phase.PENDING, False
    return PHASES.get(base, (Phase.UNKNOWN, False))


def requeue_limit_reason(st: JobStatus, max_requeues: int | None = None) -> str | None:
    """The status reason of a job that the requeue limit stopped (exit code 79), None for any other job."""
    if not st.terminal or st.exit_code.split(":")[0] != str(EXIT_REQUEUE_LIMIT):
        return None
    limit = (
        f"spec.backends.slurm.max_requeues={max_requeues}"
        if max_requeues is not None
        else "spec.backends.slurm.max_requeues"
    )
    times = f" after {st.restarts} requeue{'' if st.restarts == 1 else 's'}" if st.restarts else ""
    return (
        f"requeue limit reached{times} ({limit}): stopped instead of requeueing again; the checkpoints are "
        "kept, submit the same spec again to resume (or raise the limit)"
    )


def _explained(st: JobStatus, max_requeues: int | None = None) -> JobStatus:
    reason = requeue_limit_reason(st, max_requeues)
    if reason is not None:
        st.reason = reason
    return st


def fetch_job_status(
    job_id: str, *, raw_id: str | None = None, max_requeues: int | None = None, runner: Runner = subprocess.run
) -> JobStatus:
    """State of one job: scontrol, else squeue, else accounting (sacct with slurmdbd, or `sacct -c`).

    `job_id` may be an array task, `<array id>_<index>`; `raw_id` is that task's own job id when known (the
    only id a job-completion log has for it). A job stopped by the requeue limit (exit code 79) gets the reason
    "requeue limit reached" (naming `max_requeues` when given)."""
    proc = run_slurm(["scontrol", "show", "job", "-o", job_id], check=False, runner=runner)
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        kv = parse_scontrol(proc.stdout.splitlines()[0])
        state = kv.get("JobState", "")
        phase, terminal = phase_of(state, kv.get("Requeue", "1") == "1")
        reason = kv.get("Reason", "")
        restarts = int(kv.get("Restarts", "0") or 0)
        if state == "PENDING" and restarts and reason in ("BeginTime", "None"):
            reason = f"requeued ({reason})"
        return _explained(
            JobStatus(
                job_id,
                state,
                phase,
                terminal,
                "" if reason == "None" else reason,
                kv.get("ExitCode", ""),
                restarts,
                "scontrol",
                kv.get("StdOut", ""),
                {k: kv[k] for k in ("RunTime", "TimeLimit", "NodeList", "StartTime", "EndTime") if k in kv},
            ),
            max_requeues,
        )
    sq = run_slurm(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False, runner=runner)
    if sq.returncode == 0 and sq.stdout.strip():
        state, _, reason = sq.stdout.strip().splitlines()[0].partition(" ")
        phase, terminal = phase_of(state)
        return JobStatus(job_id, state, phase, terminal, "" if reason == "None" else reason, source="squeue")
    acct = fetch_accounting(job_id, raw_id=raw_id, runner=runner)
    if acct is not None:
        return _explained(acct, max_requeues)
    return JobStatus(
        job_id,
        "UNKNOWN",
        Phase.UNKNOWN,
        False,
        "Slurm no longer knows this job (older than MinJobAge) and no accounting is configured",
        source="none",
    )


def fetch_accounting(job_id: str, *, raw_id: str | None = None, runner: Runner = subprocess.run) -> JobStatus | None:
    """The job's final record from accounting: slurmdbd (`sacct -X`) or the job-completion log (`sacct -c`).

    The completion log lists an array task under its raw job id only (asked for `<array id>_<index>` it answers
    with the array's own raw id, another task): for a task it is asked only when `raw_id` is known."""
    if shutil.which("sacct") is None:
        return None
    fields = "JobID,State,ExitCode,Elapsed"
    queries = [(job_id, "sacct -X", "sacct")]
    if "_" not in job_id or raw_id:
        queries.append((raw_id or job_id, "sacct -c", "sacct -c"))
    for query, flags, source in queries:
        argv = [*flags.split(), "-n", "-P", "-j", query, "-o", fields]
        proc = run_slurm(argv, check=False, runner=runner)
        rows = [r.split("|") for r in proc.stdout.splitlines() if r.split("|")[0] == query]
        if proc.returncode == 0 and rows:
            # Requeued jobs leave an extra PENDING row in the completion log: the last row is the final one.
            _, state, exit_code, elapsed = (rows[-1] + ["", "", "", ""])[:4]
            phase, terminal = phase_of(state)
            return JobStatus(
                job_id, state.split()[0], phase, terminal, "", exit_code, source=source, details={"Elapsed": elapsed}
            )
    return None


def fetch_status(run_dir: str | Path, *, runner: Runner = subprocess.run) -> dict[str, object]:
    """Status of a run directory: the Slurm job (phase, state, reason) plus what the launcher recorded."""
    run_dir = Path(run_dir)
    record = load_record(run_dir)
    if record is None or record.get("backend") != "slurm" or not record.get("job_id"):
        raise SlurmError(
            f"{run_dir}: no Slurm submission recorded ({RECORD} missing, or without a job id); submit with "
            "`longhaul submit --backend slurm SPEC`"
        )
    limit = record.get("max_requeues")
    job = fetch_job_status(
        str(record["job_id"]),
        raw_id=raw_job_id(record, run_dir),
        max_requeues=limit if isinstance(limit, int) else None,
        runner=runner,
    )
    seed = {k: record[k] for k in ("seed", "seed_group") if k in record}
    return {
        "run_name": record.get("run_name"),
        "run_dir": str(run_dir),
        "backend": "slurm",
        "job": job.to_dict(),
        "history": record.get("history", []),
        **seed,
        **read_run_progress(run_dir),
    }


def raw_job_id(record: Mapping[str, object], run_dir: Path) -> str | None:
    """An array task's own job id, as the task wrote it (None for a plain job or a task that never started)."""
    if "_" not in str(record.get("job_id", "")):
        return None
    path = run_dir / TASK_JOB_ID_FILE
    try:
        text = bounded.read_text(path, _TASK_ID).strip() if path.is_file() else ""
    except (OSError, ValueError):  # not a regular file, too large, not UTF-8: as if the task never started
        text = ""
    return text if text.isdigit() else None


#: The file an array task writes its own job id into.
_TASK_ID = bounded.Limits("an array task's job-id file", max_bytes=64)


def log_path(run_dir: str | Path) -> Path:
    """The current job's log file (`--open-mode=append`: every requeued run of the job is in it)."""
    run_dir = Path(run_dir)
    record = load_record(run_dir)
    if record is None or not (record.get("log") or record.get("job_id")):
        raise SlurmError(f"{run_dir}: no Slurm submission recorded ({RECORD} missing, or without a job id)")
    return Path(str(record.get("log") or run_dir / f"slurm-{record['job_id']}.out"))


def fetch_logs(
    run_dir: str | Path, *, follow: bool = False, poll_s: float = 0.5, runner: Runner = subprocess.run
) -> Iterator[str]:
    """Yield the job's log text; with `follow`, keep yielding until the job is in a terminal state."""
    path = log_path(run_dir)
    record = load_record(run_dir) or {}
    job_id = str(record.get("job_id", ""))
    pos = bounded.tail_start(path) if os.path.lexists(path) else 0  # refuses a pipe or device: not yet: 0
    if pos:
        yield skipped_note(path, pos)
    while True:
        if path.is_file():
            for chunk, end in bounded.read_from(path, pos):
                pos = end
                yield chunk
        if not follow:
            return
        if fetch_job_status(job_id, raw_id=raw_job_id(record, Path(run_dir)), runner=runner).terminal:
            # One last read: the final lines may land between the read above and the state change.
            if path.is_file():
                for chunk, end in bounded.read_from(path, pos):
                    pos = end
                    yield chunk
            return
        time.sleep(poll_s)
