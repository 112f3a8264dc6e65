"""The sbatch path on the real Slurm with a protocol stub as the launcher (no training stack needed).

What is real: the rendered script, `longhaul submit/status/logs`, sbatch, the USR1 pre-limit signal, the trap,
`scontrol requeue`, Slurm's requeue and restart, `--open-mode=append`. What is a stand-in: the process behind
`longhaul launch` (tests/e2e/slurm/stub_launcher.py speaks the launcher's signal/exit-code protocol).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from longhaul.spec import load_spec, run_name
from longhaul.submit.slurm import fetch_accounting, fetch_job_status, fetch_status

from .conftest import TERMINAL, cancel_quietly, job_info, longhaul, wait_job, write_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "stub-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _submit(spec: Path, cwd: Path, venv: Path) -> tuple[str, Path]:
    proc = longhaul("submit", "--backend", "slurm", str(spec), cwd=cwd, env={"LONGHAUL_VENV": str(venv)})
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stdout
    exp = load_spec(spec)
    run_dir = Path(exp.spec.backends.slurm.output_dir) / run_name(exp)
    return job_id, run_dir


def test_time_limit_signal_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path, stub_venv):
    # -t 1 with a 60 s lead: Slurm sends USR1 at its first time-limit tick (≈ 30 s after start).
    spec = write_spec(
        "smoke",
        tmp_path / "mech-limit.yaml",
        name="mech-limit",
        spec__resources__time_limit="00:01:00",
        spec__backends__slurm__signal_lead_s=60,
        spec__backends__slurm__output_dir=str(tmp_path / "runs"),
    )
    job_id, run_dir = _submit(spec, tmp_path, stub_venv)
    phases: list[str] = []

    def record_phase(_info: dict) -> None:
        phase = fetch_status(run_dir)["job"]["phase"]
        if not phases or phases[-1] != phase:
            phases.append(phase)

    try:
        info = wait_job(job_id, lambda i: i.get("JobState") in TERMINAL, 240, "a terminal state", record_phase)
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState") not in TERMINAL else None)
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, log)
    assert int(info["Restarts"]) >= 1, info
    ev = _events(run_dir)
    starts = [e for e in ev if e["event"] == "start"]
    ckpts = [e for e in ev if e["event"] == "checkpoint"]
    exits = [e for e in ev if e["event"] == "exit"]
    # First run: signalled before the limit, saved, asked to be requeued.
    assert starts[0]["restart"] == 0 and starts[0]["step"] == 0
    assert ckpts and ckpts[0]["why"] == "SIGUSR1" and ckpts[0]["restart"] == 0 and ckpts[0]["step"] > 0
    assert exits[0] == {**exits[0], "code": 75, "restart": 0}
    # Every later run resumed from exactly where the previous one checkpointed; the last one finished.
    for prev_exit, start in zip(exits, starts[1:], strict=False):
        assert start["step"] == prev_exit["step"], ev
        assert start["restart"] == prev_exit["restart"] + 1
    assert exits[-1]["code"] == 0 and len(starts) == int(info["Restarts"]) + 1
    # Launcher argv and environment came from the rendered script.
    assert starts[0]["argv"] == [
        "launch",
        "--spec",
        f"{run_dir}/experiment.yaml",
        "--backend",
        "slurm",
        "--run-dir",
        str(run_dir),
    ]
    assert starts[0]["spec_exists"] and starts[0]["offline"] == "1" and starts[0]["run_name"] == run_dir.name
    # One log file holds every run (--open-mode=append), with the trap's messages.
    assert "asking the launcher to save a checkpoint" in log and f"requeueing job {job_id}" in log
    assert log.count("longhaul: job ") == len(starts)
    # Status went through the phases, ending Succeeded; the CLI reports it.
    assert phases[-1] == "Succeeded" and "Running" in phases and "Pending" in phases[phases.index("Running") :], phases
    st = longhaul("status", str(run_dir), cwd=tmp_path)
    assert st.returncode == 0 and "phase=Succeeded" in st.stdout and "state=COMPLETED" in st.stdout, st


def test_external_requeue_resumes_from_checkpoint(slurm_cluster, tmp_path, stub_venv):
    spec = write_spec(
        "smoke",
        tmp_path / "mech-requeue.yaml",
        name="mech-requeue",
        spec__backends__slurm__output_dir=str(tmp_path / "runs"),
    )
    job_id, run_dir = _submit(spec, tmp_path, stub_venv)
    try:
        wait_job(
            job_id,
            lambda i: (run_dir / "stub.ckpt").is_file() and int((run_dir / "stub.ckpt").read_text() or 0) >= 3,
            120,
            "a checkpoint at step >= 3",
        )
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True, timeout=30)
        info = wait_job(job_id, lambda i: i.get("JobState") in TERMINAL, 180, "a terminal state")
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState") not in TERMINAL else None)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    ev = _events(run_dir)
    starts = [e for e in ev if e["event"] == "start"]
    assert [s["restart"] for s in starts] == [0, 1]
    # The second run starts from the newest checkpoint the first one wrote before it was stopped.
    first_run_steps = [e["step"] for e in ev if e["restart"] == 0 and e["event"] == "exit"]
    assert starts[1]["step"] >= 3
    if first_run_steps:  # the stub saw SIGTERM before the kill
        assert starts[1]["step"] == first_run_steps[0]


def test_cancel_status_logs_and_double_submit(slurm_cluster, tmp_path, stub_venv):
    spec = write_spec(
        "smoke",
        tmp_path / "mech-cancel.yaml",
        name="mech-cancel",
        spec__backends__slurm__output_dir=str(tmp_path / "runs"),
    )
    job_id, run_dir = _submit(spec, tmp_path, stub_venv)
    try:
        wait_job(job_id, lambda i: i.get("JobState") == "RUNNING" and (run_dir / "stub.ckpt").is_file(), 120, "RUNNING")
        assert fetch_status(run_dir)["job"]["phase"] == "Running"
        again = longhaul("submit", "--backend", "slurm", str(spec), cwd=tmp_path, env={"LONGHAUL_VENV": str(stub_venv)})
        assert again.returncode != 0 and f"already has job {job_id}" in again.stderr, again
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        info = wait_job(job_id, lambda i: i.get("JobState") in TERMINAL, 60, "a terminal state")
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState") not in TERMINAL else None)
    assert info["JobState"] == "CANCELLED"
    st = fetch_status(run_dir)
    assert st["job"]["phase"] == "Failed" and st["job"]["state"] == "CANCELLED" and st["job"]["terminal"]
    logs = longhaul("logs", str(run_dir), cwd=tmp_path)
    assert logs.returncode == 0 and "longhaul: job " + job_id in logs.stdout, logs
    follow = longhaul("logs", "--follow", str(run_dir), cwd=tmp_path, timeout=60)  # ends: the job is terminal
    assert follow.returncode == 0 and follow.stdout == logs.stdout
    # After MinJobAge scontrol forgets the job: accounting answers (here the job-completion log, `sacct -c`).
    acct = None
    for _ in range(50):
        acct = fetch_accounting(job_id)
        if acct is not None:
            break
        time.sleep(0.2)
    assert acct is not None and acct.state == "CANCELLED" and acct.phase == "Failed" and acct.terminal, acct
    gone = fetch_job_status("999999999")
    assert gone.phase == "Unknown" and not gone.terminal and "no longer knows" in gone.reason


def test_srun_step_forwards_the_checkpoint_signal_and_exit_code(slurm_cluster, tmp_path):
    """Multi-node and pyxis scripts run the launcher as an srun step: USR1 sent to srun must reach the task,
    and the task's exit code 75 must come back as srun's, or the requeue decision breaks."""
    script = tmp_path / "fwd.sh"
    out = tmp_path / "fwd.out"
    script.write_text(
        "#!/bin/bash\n"
        "srun --overlap --nodes=1 --ntasks=1 bash -c "
        "'trap \"echo task-got-USR1; exit 75\" USR1; echo task-up; while :; do sleep 0.2; done' &\n"
        "pid=$!\n"
        f"until grep -q task-up {out}; do sleep 0.2; done\n"
        'kill -USR1 "$pid"\n'
        'rc=0; wait "$pid" || rc=$?\n'
        'echo "srun-exit=$rc"\n'
    )
    job_id = subprocess.run(
        ["sbatch", "--parsable", "-t", "2", "-o", str(out), str(script)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    try:
        info = wait_job(job_id, lambda i: i.get("JobState") in TERMINAL, 90, "a terminal state")
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState") not in TERMINAL else None)
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", (info, text)
    assert "task-got-USR1" in text and "srun-exit=75" in text, text
