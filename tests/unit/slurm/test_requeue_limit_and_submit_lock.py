"""The requeue limit (rendered into the batch script, reported by status) and the submit lock (one job per run),
without a cluster: the script runs under bash with fake Slurm commands; submits race in threads of one process
(flock locks belong to open file descriptions, so two threads conflict as two processes do). The same behaviour
on the real Slurm: tests/reliability/test_slurm_faults.py."""

from __future__ import annotations

import fcntl
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from longhaul.render.slurm import EXIT_REQUEUE_LIMIT, render_slurm, slurm_run_dir
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name, seed_runs
from longhaul.submit.slurm import LOCK_FILE, SlurmError, fetch_status, submit_lock, submit_run
from support.slurm import fake_venv

REPO = Path(__file__).resolve().parents[3]


def _exp(seeds: list[int] | None = None, **slurm: object) -> Experiment:
    doc = yaml.safe_load((REPO / "specs/smoke.yaml").read_text())
    doc["spec"]["backends"]["slurm"].update(slurm)
    if seeds:
        doc["spec"]["algorithm"].pop("seed", None)
        doc["spec"]["algorithm"]["seeds"] = seeds
    return Experiment.model_validate(doc)


# ------------------------------------------------------------------------------------------------- spec, render


def test_max_requeues_defaults_to_ten_and_accepts_null() -> None:
    assert _exp().spec.backends.slurm.max_requeues == 10
    assert _exp(max_requeues=None).spec.backends.slurm.max_requeues is None
    assert _exp(max_requeues=0).spec.backends.slurm.max_requeues == 0
    with pytest.raises(ValidationError, match="max_requeues"):
        _exp(max_requeues=-1)


def test_limit_is_rendered_only_when_the_job_requeues() -> None:
    script = render_slurm(_exp(max_requeues=3))
    assert 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 3 ]; then' in script  # at the start, whoever requeued
    assert 'if [ "${SLURM_RESTART_COUNT:-0}" -ge 3 ]; then' in script  # before its own requeue
    assert script.count(f"exit {EXIT_REQUEUE_LIMIT}") == 2
    # The start check comes before the runtime and the launcher.
    assert script.index("-gt 3") < script.index("source ") < script.index("longhaul launch")
    assert "requeue limit" not in render_slurm(_exp(max_requeues=None))
    assert "requeue limit" not in render_slurm(_exp(requeue=False))
    array = render_slurm(_exp([1, 2], max_requeues=2))
    assert "job $LONGHAUL_JOB_ID was requeued" in array and 'scontrol requeue "$LONGHAUL_JOB_ID"' in array


def _run_script(tmp_path: Path, exp: Experiment, restart: int) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the rendered script as restart `restart` of job 600 with a recording `scontrol`; (result, its calls)."""
    calls = tmp_path / "scontrol.args"
    calls.unlink(missing_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    Path(slurm_run_dir(exp)).mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(exp))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_ID": "600",
        "SLURM_RESTART_COUNT": str(restart),
    }
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return proc, calls.read_text() if calls.is_file() else ""


#: A launcher that asks its batch shell for the pre-limit signal; the trap forwards it back; it "saves", exits 75.
SAVE_AND_REQUEUE = (
    "import os, signal, sys, time\n"
    "open(os.environ['LONGHAUL_RUN_DIR'] + '/ran', 'a').write('x')\n"
    "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))\n"
    "os.kill(os.getppid(), signal.SIGUSR1)\n"
    "time.sleep(30)\nsys.exit(1)\n"
)


def test_own_requeue_stops_at_the_limit(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, SAVE_AND_REQUEUE)
    exp = _exp(max_requeues=2, venv=str(venv), output_dir=str(tmp_path / "runs"))
    for restart in (0, 1):
        proc, calls = _run_script(tmp_path, exp, restart)
        assert proc.returncode == 0 and calls == "requeue 600\n", proc.stderr
    proc, calls = _run_script(tmp_path, exp, 2)
    assert proc.returncode == EXIT_REQUEUE_LIMIT and calls == "", proc.stderr
    assert (
        "checkpoint saved; requeue limit reached: job 600 was already requeued 2 times "
        "(spec.backends.slurm.max_requeues=2); not requeueing"
    ) in proc.stderr
    assert (tmp_path / "runs" / run_name(exp) / "ran").read_text() == "xxx"  # the launcher ran (and saved) each time
    # Unlimited: requeues whatever the count.
    exp = _exp(max_requeues=None, venv=str(venv), output_dir=str(tmp_path / "runs"))
    proc, calls = _run_script(tmp_path, exp, 500)
    assert proc.returncode == 0 and calls == "requeue 600\n", proc.stderr


def test_requeued_past_the_limit_stops_before_running(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, SAVE_AND_REQUEUE)
    exp = _exp(max_requeues=1, venv=str(venv), output_dir=str(tmp_path / "runs"))
    proc, calls = _run_script(tmp_path, exp, 2)  # e.g. `scontrol requeue` twice from outside
    assert proc.returncode == EXIT_REQUEUE_LIMIT and calls == "", proc.stderr
    assert (
        "requeue limit reached: job 600 was requeued 2 times, more than spec.backends.slurm.max_requeues=1; "
        "stopping with exit code 79 without running"
    ) in proc.stderr
    assert not (tmp_path / "runs" / run_name(exp) / "ran").exists()
    proc, calls = _run_script(tmp_path, exp, 1)  # at the limit: runs, saves, and does not requeue
    assert proc.returncode == EXIT_REQUEUE_LIMIT and calls == "" and "not requeueing" in proc.stderr


# ------------------------------------------------------------------------------------------------- submit lock


@pytest.fixture
def slurm_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's command names on PATH (the adapter checks them); what they answer comes from a Python runner."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("sbatch", "scontrol", "squeue", "sacct"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 99\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


class FakeSlurm:
    """A runner for the adapter: sbatch takes `sbatch_s` and hands out ids; submitted jobs stay RUNNING."""

    def __init__(self, sbatch_s: float = 0.3) -> None:
        self.sbatch_s = sbatch_s
        self.jobs: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sbatch":
            time.sleep(self.sbatch_s)  # the window two unserialised submits both fall into
            with self.lock:
                self.jobs.append(str(700 + len(self.jobs)))
                return subprocess.CompletedProcess(argv, 0, self.jobs[-1] + "\n", "")
        if argv[:3] == ["scontrol", "show", "job"]:
            job = argv[-1]
            array, _, task = job.partition("_")
            if array in self.jobs:
                line = (
                    f"JobId={array} ArrayJobId={array} ArrayTaskId={task} JobName=x JobState=RUNNING "
                    "Reason=None Requeue=1 Restarts=0 ExitCode=0:0"
                )
                return subprocess.CompletedProcess(argv, 0, line + "\n", "")
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
        return subprocess.CompletedProcess(argv, 1, "", "")


def _race(n: int, submit) -> tuple[list[object], list[BaseException]]:
    barrier = threading.Barrier(n)
    results: list[object] = []
    errors: list[BaseException] = []

    def one() -> None:
        barrier.wait()
        try:
            results.append(submit())
        except SlurmError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


@pytest.mark.parametrize("seeds", [None, [1, 2]], ids=["one run", "job array"])
def test_concurrent_submits_make_one_job(tmp_path: Path, slurm_on_path: None, seeds: list[int] | None) -> None:
    venv = fake_venv(tmp_path, "")
    exp = _exp(seeds)
    slurm = FakeSlurm()
    environ = {**os.environ, "LONGHAUL_VENV": str(venv)}
    results, errors = _race(5, lambda: submit_run(exp, submit_dir=tmp_path, environ=environ, runner=slurm))
    assert slurm.jobs == ["700"] and len(results) == 1 and len(errors) == 4
    expected = "is still queued or running" if seeds else "already has job 700 (RUNNING)"
    assert all(expected in str(e) for e in errors), errors
    lock = tmp_path / slurm_run_dir(exp) / LOCK_FILE  # an array: the group's directory
    assert lock.is_file() and (
        not seeds or all(not (tmp_path / slurm_run_dir(r) / LOCK_FILE).exists() for r in seed_runs(exp))
    )


def test_a_held_lock_times_out_naming_its_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r"
    with submit_lock(run_dir, "run r"):
        assert f"pid {os.getpid()} on " in (run_dir / LOCK_FILE).read_text()
        t0 = time.monotonic()
        with pytest.raises(
            SlurmError,
            match=rf"run r: another `longhaul submit` \(pid {os.getpid()} on .*\) has held "
            r".*\.submit\.lock for more than 0 s; nothing was submitted",
        ):
            with submit_lock(run_dir, "run r", timeout_s=0.2):
                pass
        assert time.monotonic() - t0 < 5
    with submit_lock(run_dir, "run r", timeout_s=0.2):  # released on exit; a killed holder releases it too
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_unknown_state_of_the_recorded_job_refuses(tmp_path: Path, slurm_on_path: None) -> None:
    venv = fake_venv(tmp_path, "")
    exp = _exp()
    environ = {**os.environ, "LONGHAUL_VENV": str(venv)}
    slurm = FakeSlurm(sbatch_s=0)
    submit_run(exp, submit_dir=tmp_path, environ=environ, runner=slurm)

    def timing_out(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if argv[0] == "scontrol":
            raise subprocess.TimeoutExpired(argv, 60)
        return slurm(argv, **kw)

    with pytest.raises(SlurmError, match="cannot tell whether job 700 .* is still queued or running .*did not answer"):
        submit_run(exp, submit_dir=tmp_path, environ=environ, runner=timing_out)
    assert slurm.jobs == ["700"]


# ------------------------------------------------------------------------------------------------- status


@pytest.mark.parametrize(
    "restarts,exit_code,limit,reason",
    [
        ("2", "79:0", 1, "requeue limit reached after 2 requeues (spec.backends.slurm.max_requeues=1)"),
        ("0", "79:0", None, "requeue limit reached (spec.backends.slurm.max_requeues)"),
        ("1", "3:0", 1, "NonZeroExitCode"),
    ],
)
def test_status_says_the_requeue_limit_stopped_the_job(
    tmp_path: Path, slurm_on_path: None, restarts: str, exit_code: str, limit: int | None, reason: str
) -> None:
    venv = fake_venv(tmp_path, "")
    exp = _exp(max_requeues=limit)
    res = submit_run(
        exp, submit_dir=tmp_path, environ={**os.environ, "LONGHAUL_VENV": str(venv)}, runner=FakeSlurm(sbatch_s=0)
    )

    def finished(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        line = (
            f"JobId=700 JobName=x JobState=FAILED Reason=NonZeroExitCode Requeue=1 Restarts={restarts} "
            f"ExitCode={exit_code}"
        )
        return subprocess.CompletedProcess(argv, 0, line + "\n", "")

    job = fetch_status(res.run_dir, runner=finished)["job"]
    assert (job["phase"], job["state"], job["exit_code"]) == ("Failed", "FAILED", exit_code)
    assert job["reason"].startswith(reason), job["reason"]
    if exit_code.startswith("79"):
        assert "submit the same spec again to resume" in job["reason"]
