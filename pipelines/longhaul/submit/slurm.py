"""Slurm backend (thin I/O): ship what `render_slurm` returned, read job state back from the Slurm CLI.

Submitting writes `<run_dir>/<run_name>.sbatch` and `<run_dir>/experiment.yaml` (the resolved spec the launcher
re-validates), runs `sbatch --parsable` from the submit directory and records the job in
`<run_dir>/submit.json`. Job state comes from the Slurm CLI (`longhaul.submit.slurm_status`: scontrol, squeue,
then accounting; slurmdbd is never required); this module is the backend `longhaul.submit.get_backend` finds, so
it also exports the status functions (`__all__`).

Training seeds (`spec.algorithm.seeds`): one job array for the group (`render_slurm`), submitted once. Every
seed run gets its own run directory (`<output_dir>/<group>-s<seed>`: resolved spec, `submit.json` with job id
`<array job id>_<task index>`); the script and the tasks' logs live in the group's directory
(`<output_dir>/<group>`). `fetch_status`/`fetch_logs` on a seed run directory follow that one task.

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
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from longhaul import constants as C
from longhaul.files import PLAIN, atomic_write_text
from longhaul.layout import RECORD_FILE as RECORD
from longhaul.render.slurm import TASK_JOB_ID_FILE, render_slurm, slurm_run_dir
from longhaul.spec.backends import ContainerRuntime
from longhaul.spec.models import Experiment, resolved_yaml
from longhaul.spec.naming import run_name, seed_runs
from longhaul.submit import SubmitResult
from longhaul.submit.slurm_cli import CMD_TIMEOUT_S, Runner, SlurmError, run_slurm
from longhaul.submit.slurm_status import (
    PHASES,
    JobStatus,
    fetch_accounting,
    fetch_job_status,
    fetch_logs,
    fetch_status,
    load_record,
    log_path,
    parse_scontrol,
    phase_of,
    raw_job_id,
    requeue_limit_reason,
)

#: The backend's surface (`longhaul.submit.get_backend`): submit, status and logs of a Slurm run.
__all__ = [
    "CMD_TIMEOUT_S",
    "LOCK_FILE",
    "LOCK_TIMEOUT_S",
    "PHASES",
    "RECORD",
    "JobStatus",
    "SlurmError",
    "fetch_accounting",
    "fetch_job_status",
    "fetch_logs",
    "fetch_status",
    "load_record",
    "log_path",
    "parse_scontrol",
    "phase_of",
    "requeue_limit_reason",
    "submit_lock",
    "submit_run",
    "submit_seed_array",
]

#: Held (flock) by `longhaul submit` from the live-job check to submit.json: one job per run (module docstring).
LOCK_FILE = ".submit.lock"
#: How long a second submit waits for the lock: the holder runs at most scontrol, squeue, two sacct and sbatch,
#: each bounded by CMD_TIMEOUT_S.
LOCK_TIMEOUT_S = 6 * CMD_TIMEOUT_S

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


def _live_job(record: Mapping[str, object], run_dir: Path, runner: Runner) -> JobStatus | None:
    """The recorded job when Slurm still has it queued or running (submitting again would run it twice)."""
    previous = str(record.get("job_id") or "")
    if not previous:
        return None
    try:
        st = fetch_job_status(previous, raw_id=raw_job_id(record, run_dir), runner=runner)
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
    proc = run_slurm(["sbatch", "--parsable", str(script_path)], cwd=submit_dir, env=env, runner=runner)
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
