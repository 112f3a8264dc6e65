"""Slurm backend (thin I/O): ship what `render_slurm` returned, read job state back from the Slurm CLI.

Submitting writes `<run_dir>/<run_name>.sbatch` and `<run_dir>/experiment.yaml` (the resolved spec the launcher
re-validates), runs `sbatch --parsable` from the submit directory and records the job in
`<run_dir>/submit.json`. State comes from `scontrol show job -o` (live jobs and MinJobAge after the end),
`squeue -h -j ID -o '%T %r'` when scontrol cannot answer, and accounting last: `sacct` with slurmdbd or, on
clusters that only keep a job-completion log, `sacct -c`. slurmdbd is never required.

Training seeds (`spec.algorithm.seeds`): one job array for the group (`render_slurm`), submitted once. Every
seed run gets its own run directory (`<output_dir>/<group>-s<seed>`: resolved spec, `submit.json` with job id
`<array job id>_<task index>`); the script and the tasks' logs live in the group's directory
(`<output_dir>/<group>`). `fetch_status`/`fetch_logs` on a seed run directory follow that one task. A
job-completion log (`sacct -c`) knows array tasks only by their raw job id, which each task writes to
`<run dir>/slurm-task-job-id`.

One job per run, even when several `longhaul submit` of the same spec start at the same moment: the whole of
"is a job of this run already queued or running? → write the script and resolved spec → sbatch → write
submit.json" runs under an exclusive `fcntl.flock` on `<run dir>/.submit.lock` (a job array: on the group's
directory). The loser waits for the lock (at most LOCK_TIMEOUT_S; the holder only runs bounded Slurm commands),
then finds the winner's live job and refuses with the usual "already has job N" message. The kernel drops the
lock when its holder exits, so a killed submit leaves no stale lock. The run directory must be on a filesystem
with working locks (local disks, NFS with its lock manager, Lustre mounted with `-o flock`); where locking
fails, submit refuses with that error rather than submit unserialised. When Slurm cannot say whether the
recorded job is still live (a command timed out), submit refuses too: a duplicate job is worse than a retry.

The requeue limit (`spec.backends.slurm.max_requeues`, enforced by the batch script, see `longhaul.render.slurm`)
ends a job FAILED with exit code 79 (EXIT_REQUEUE_LIMIT); `fetch_status` reports it as "requeue limit reached",
with the limit recorded in submit.json.

No Python binding to Slurm is used on purpose (pyslurm does not build against Slurm 22.05): the CLI behaves
the same on CI and on real clusters, and sbatch's own error text becomes our error message.

Size: over 400 lines because submit, status, logs and cancel against the Slurm CLI share its locking protocol.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from longhaul import bounded
from longhaul import constants as C
from longhaul.files import PLAIN, atomic_write_text
from longhaul.k8s.status import Phase
from longhaul.layout import RECORD_FILE as RECORD
from longhaul.render.slurm import EXIT_REQUEUE_LIMIT, TASK_JOB_ID_FILE, render_slurm, slurm_run_dir
from longhaul.spec.models import ContainerRuntime, Experiment
from longhaul.spec.naming import resolved_yaml, run_name, seed_runs
from longhaul.submit import SubmitResult, read_record, read_run_progress, skipped_note

CMD_TIMEOUT_S = 60
#: Held (flock) by `longhaul submit` from the live-job check to submit.json: one job per run (module docstring).
LOCK_FILE = ".submit.lock"
#: How long a second submit waits for the lock: the holder runs at most scontrol, squeue, two sacct and sbatch,
#: each bounded by CMD_TIMEOUT_S.
LOCK_TIMEOUT_S = 6 * CMD_TIMEOUT_S

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


class SlurmError(RuntimeError):
    """A Slurm command failed or Slurm is not usable; the message says which command and why."""


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


# ------------------------------------------------------------------------------------------------- running


Runner = Callable[..., subprocess.CompletedProcess[str]]


def _run(
    argv: list[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    runner: Runner = subprocess.run,
) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"`{argv[0]}` not found on PATH: the slurm backend needs Slurm's client commands "
            "(Debian: apt-get install slurm-client; CI: scripts/ci/slurm-up.sh)"
        )
    try:
        proc = runner(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {CMD_TIMEOUT_S} s (is slurmctld up?)") from exc
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
        raise SlurmError(f"`{' '.join(argv)}` failed: {msg}")
    return proc


# ------------------------------------------------------------------------------------------------- submit


def _job_environment(exp: Experiment, environ: Mapping[str, str], submit_dir: Path) -> dict[str, str]:
    """The environment sbatch exports into the job, with what the rendered script needs checked up front."""
    env = dict(environ)
    slurm = exp.spec.backends.slurm
    runtime = slurm.container.runtime
    if runtime == ContainerRuntime.NONE and not slurm.venv:
        # Runtime 'none' without a venv in the spec: the job runs in the submitting interpreter's environment.
        venv = env.get(C.ENV_VENV) or sys.prefix
        if not Path(venv, "bin", "activate").is_file():
            raise SlurmError(
                f"runtime 'none': {venv}/bin/activate does not exist; set spec.backends.slurm.venv "
                f"or {C.ENV_VENV} to a virtualenv that has longhaul installed, or submit from one"
            )
        env[C.ENV_VENV] = str(Path(venv).resolve())
    if runtime != ContainerRuntime.NONE and not slurm.container.image and not env.get(C.ENV_IMAGE):
        raise SlurmError(
            f"runtime '{runtime}': no image; set spec.backends.slurm.container.image or export "
            f"{C.ENV_IMAGE} (apptainer: path of the .sif; pyxis: image reference or squashfs)"
        )
    return env


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


def _live_job(record: Mapping[str, object], run_dir: Path, runner: Runner) -> JobStatus | None:
    """The recorded job when Slurm still has it queued or running (submitting again would run it twice)."""
    previous = str(record.get("job_id") or "")
    if not previous:
        return None
    try:
        st = fetch_job_status(previous, raw_id=_raw_job_id(record, run_dir), runner=runner)
    except SlurmError as exc:
        raise SlurmError(
            f"cannot tell whether job {previous} of {run_dir} is still queued or running ({exc}); "
            "nothing was submitted (a second job of the same run would train it twice): retry when "
            "Slurm answers"
        ) from exc
    return None if st.terminal else st


@contextmanager
def submit_lock(run_dir: Path, what: str, *, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive flock on `<run_dir>/.submit.lock` (created with `run_dir`) for the duration.

    Waits up to `timeout_s` for another holder; SlurmError when that runs out or the filesystem cannot lock."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = path.read_text(encoding="utf-8", errors="replace").strip() or "another process"
                    raise SlurmError(
                        f"{what}: another `longhaul submit` ({holder}) has held {path} for more than "
                        f"{timeout_s:.0f} s; nothing was submitted. Retry, or check that process"
                    ) from None
                time.sleep(0.05)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                raise SlurmError(
                    f"{what}: cannot lock {path} ({exc.strerror}); nothing was submitted. The run "
                    "directory needs a filesystem with file locks (NFS with its lock manager, Lustre "
                    "mounted with -o flock) so that two submits of one spec make one job"
                ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # drops the lock


def _write_record(run_dir: Path, record: Mapping[str, object]) -> None:
    atomic_write_text(run_dir / RECORD, json.dumps(record, indent=2) + "\n", mode=PLAIN)


def _sbatch(script_path: Path, submit_dir: Path, env: Mapping[str, str], runner: Runner) -> str:
    proc = _run(["sbatch", "--parsable", str(script_path)], cwd=submit_dir, env=env, runner=runner)
    job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable printed {proc.stdout!r}, not a job id")
    return job_id


def submit_run(
    exp: Experiment,
    *,
    dry_run: bool = False,
    submit_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    runner: Runner = subprocess.run,
) -> SubmitResult:
    """Render, write and `sbatch` the run. With `dry_run`, only render (nothing written, nothing run).

    An Experiment with training seeds is submitted as one job array (`submit_seed_array`)."""
    if exp.spec.algorithm.seeds:
        return submit_seed_array(exp, dry_run=dry_run, submit_dir=submit_dir, environ=environ, runner=runner)
    script = render_slurm(exp)
    name = run_name(exp)
    submit_dir = Path(submit_dir or Path.cwd()).resolve()
    run_dir = submit_dir / slurm_run_dir(exp)
    if dry_run:
        return SubmitResult(
            "slurm",
            name,
            str(run_dir),
            None,
            script,
            True,
            f"dry run: would write {run_dir}/{name}.sbatch and run `sbatch --parsable` there",
        )
    env = _job_environment(exp, os.environ if environ is None else environ, submit_dir)
    script_path = run_dir / f"{name}.sbatch"
    # Slurm does not create the --output directory (a missing one fails the job at launch, ExitCode 0:53);
    # submit_lock creates it.
    with submit_lock(run_dir, f"run {name}"):
        record = load_record(run_dir) or {}
        live = _live_job(record, run_dir, runner)
        if live is not None:
            previous = live.job_id
            raise SlurmError(
                f"run {name} already has job {previous} ({live.state}); follow it with "
                f"`longhaul status {run_dir}` or cancel it with `scancel {previous}` first"
            )
        (run_dir / C.SPEC_FILENAME).write_text(resolved_yaml(exp), encoding="utf-8")
        script_path.write_text(script, encoding="utf-8")
        job_id = _sbatch(script_path, submit_dir, env, runner)
        history = [str(j) for j in record.get("history", [])] + [job_id]  # type: ignore[union-attr]
        new_record = {
            "backend": "slurm",
            "run_name": name,
            "job_id": job_id,
            "history": history,
            "script": script_path.name,
            "submit_dir": str(submit_dir),
            "log": str(run_dir / f"slurm-{job_id}.out"),
            "max_requeues": _requeue_limit(exp),
        }
        _write_record(run_dir, new_record)
    return SubmitResult(
        "slurm",
        name,
        str(run_dir),
        job_id,
        script,
        False,
        f"submitted job {job_id} for run {name}; follow: longhaul status {run_dir} / longhaul logs {run_dir} --follow",
        script_path=str(script_path),
    )


def _requeue_limit(exp: Experiment) -> int | None:
    """The requeue limit the rendered script enforces (None: unlimited, or requeue is off)."""
    slurm = exp.spec.backends.slurm
    return slurm.max_requeues if slurm.requeue else None


def _submit_array_locked(
    exp: Experiment,
    script: str,
    script_path: Path,
    group_dir: Path,
    run_dirs: list[Path],
    submit_dir: Path,
    env: Mapping[str, str],
    runner: Runner,
) -> str:
    """`submit_seed_array` under the group's lock: refuse while any task is live, else write, sbatch, record."""
    group = run_name(exp)
    runs = seed_runs(exp)
    records = [load_record(d) or {} for d in run_dirs]
    live = [
        (run_name(r), d, st)
        for r, d, rec in zip(runs, run_dirs, records, strict=True)
        if (st := _live_job(rec, d, runner)) is not None
    ]
    if live:
        listed = "; ".join(f"{n} has job {st.job_id} ({st.state}) in {d}" for n, d, st in live)
        arrays = sorted({st.job_id.split("_")[0] for _, _, st in live})
        raise SlurmError(
            f"run group {group} is still queued or running: {listed}; follow it with "
            f"`longhaul status SPEC` or cancel it with `scancel {' '.join(arrays)}` first "
            "(the whole group is submitted again, as one array)"
        )
    # Slurm does not create the --output directory: every seed run's must exist.
    for r, d in zip(runs, run_dirs, strict=True):
        d.mkdir(parents=True, exist_ok=True)
        (d / C.SPEC_FILENAME).write_text(resolved_yaml(r), encoding="utf-8")
        (d / TASK_JOB_ID_FILE).unlink(missing_ok=True)  # an earlier task's raw id; the new task writes its own
    script_path.write_text(script, encoding="utf-8")
    array_id = _sbatch(script_path, submit_dir, env, runner)
    for i, (r, d, rec) in enumerate(zip(runs, run_dirs, records, strict=True)):
        job_id = f"{array_id}_{i}"
        _write_record(
            d,
            {
                "backend": "slurm",
                "run_name": run_name(r),
                "job_id": job_id,
                "history": [str(j) for j in rec.get("history", [])] + [job_id],  # type: ignore[union-attr]
                "script": os.path.relpath(script_path, d),
                "submit_dir": str(submit_dir),
                "log": str(group_dir / f"slurm-{job_id}.out"),
                "seed": r.spec.algorithm.seed,
                "seed_group": group,
                "array_job_id": array_id,
                "array_task": i,
                "max_requeues": _requeue_limit(exp),
            },
        )
    return array_id


def submit_seed_array(
    exp: Experiment,
    *,
    dry_run: bool = False,
    submit_dir: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    runner: Runner = subprocess.run,
) -> SubmitResult:
    """Submit an Experiment with training seeds as one job array: task i runs seed run i (module docstring).

    Refused, with nothing written or submitted, while any task of an earlier submission is queued or running.
    """
    script = render_slurm(exp)
    group = run_name(exp)
    runs = seed_runs(exp)
    submit_dir = Path(submit_dir or Path.cwd()).resolve()
    group_dir = submit_dir / slurm_run_dir(exp)
    script_path = group_dir / f"{group}.sbatch"
    run_dirs = [submit_dir / slurm_run_dir(r) for r in runs]
    if dry_run:
        return SubmitResult(
            "slurm",
            group,
            str(group_dir),
            None,
            script,
            True,
            f"dry run: would write {script_path}, the resolved spec of each of the {len(runs)} seed "
            f"runs ({', '.join(str(d) for d in run_dirs)}) and run `sbatch --parsable` once "
            f"(a job array, one task per seed)",
        )
    env = _job_environment(exp, os.environ if environ is None else environ, submit_dir)
    # One lock for the group, on its directory (created by submit_lock; Slurm does not create --output dirs).
    with submit_lock(group_dir, f"run group {group}"):
        array_id = _submit_array_locked(exp, script, script_path, group_dir, run_dirs, submit_dir, env, runner)
    listed = ", ".join(f"{run_name(r)} (task {i})" for i, r in enumerate(runs))
    return SubmitResult(
        "slurm",
        group,
        str(group_dir),
        array_id,
        script,
        False,
        f"submitted job array {array_id} for run group {group}, one task per training seed: {listed}; "
        f"run directories under {group_dir.parent}; follow: longhaul status SPEC / "
        f"longhaul logs {run_dirs[0]} --follow",
        script_path=str(script_path),
    )


# ------------------------------------------------------------------------------------------------- status

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
    proc = _run(["scontrol", "show", "job", "-o", job_id], check=False, runner=runner)
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
    sq = _run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False, runner=runner)
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
        proc = _run(argv, check=False, runner=runner)
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
        raw_id=_raw_job_id(record, run_dir),
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


def _raw_job_id(record: Mapping[str, object], run_dir: Path) -> str | None:
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


# ------------------------------------------------------------------------------------------------- logs


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
        if fetch_job_status(job_id, raw_id=_raw_job_id(record, Path(run_dir)), runner=runner).terminal:
            # One last read: the final lines may land between the read above and the state change.
            if path.is_file():
                for chunk, end in bounded.read_from(path, pos):
                    pos = end
                    yield chunk
            return
        time.sleep(poll_s)
