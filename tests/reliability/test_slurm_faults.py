"""Slurm faults on the real one-node cluster (issue 15, Slurm part), with figures for the reliability report.

What is real: Slurm (sbatch, `scontrol requeue`, the batch-shell signal, requeue and restart), the rendered batch
script (trap, requeue decision, requeue limit), `longhaul submit` / `longhaul status` and, for the concurrent
submits, the CLI in separate processes. The stand-in is the process behind `longhaul launch`:
tests/e2e/slurm/stub_launcher.py in its veRL checkpoint mode (slow, deterministic saves in veRL's layout, the
tracker written last; a start resumes from `longhaul.checkpoints.latest_step`).

1. Requeue during a checkpoint write: `scontrol requeue` (SIGTERM to the job) or the pre-limit SIGUSR1 (sent to
   the batch shell, as Slurm does) at a seeded random moment of a save → the job resumes from the newest complete
   checkpoint, never a half-written one, and loses no completed step.
2. Requeue limit: a job pushed past `spec.backends.slurm.max_requeues` (both ways: its own requeue after the
   checkpoint signal, and requeues from outside) stops FAILED, exit code 79, and `longhaul status` says why.
3. Concurrent submits: N `longhaul submit` processes of one spec released at the same instant → one job (the
   submit lock on the run directory; for a multi-seed spec one job array, the lock on the group directory).
   Figures: injected = submits; survived = submits of trials that ended with exactly one job, one submit that
   printed its id and the others refused with the "already has job" / "still queued or running" message;
   lost = jobs beyond one per trial. (Control, run by hand with the lock patched out of the racers: 2, 3 and 1
   jobs from three trials of 6 — the harness does produce overlapping submits.)

Every trial records its outcome even when it breaks (a timeout counts as not survived) before the test asserts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from longhaul.checkpoints import TRACKER_FILE
from longhaul.render.slurm import EXIT_REQUEUE_LIMIT, slurm_run_dir
from longhaul.spec import load_spec, run_name, seed_runs
from longhaul.submit.slurm import parse_scontrol, submit_run
from support.slurm import DROP, STUB_LAUNCHER, TERMINAL, cancel_quietly, job_info, write_spec
from support.slurm import slurm_cluster as slurm_cluster  # a fixture
from support.slurm import stub_venv as stub_venv  # a fixture

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

AREA = "slurm"
#: The stub's save: 2 shards x 1.5 s (4 chunks each), then data.pt and the tracker.
SHARDS, SHARD_WRITE_S, CHUNKS = 2, 1.5, 4
WRITE_S = SHARDS * SHARD_WRITE_S
#: Seeded trials of item 1; even ones are `scontrol requeue`, odd ones the pre-limit SIGUSR1.
CKPT_TRIALS, CKPT_SEED = 8, 15
#: Item 3: trials x concurrent submits per trial.
RACE_TRIALS, RACE_N = 2, 6
RACE_ARRAY_TRIALS, RACE_ARRAY_N = 2, 5


def _stub():
    spec = importlib.util.spec_from_file_location("stub_launcher", STUB_LAUNCHER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "stub-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _failed(what: object, exc: BaseException) -> dict:
    """A trial that broke (a timeout, a missing file) counts as not survived, with what went wrong: the record is
    written before the test asserts."""
    return {"trial": what, "ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _guarded(fn: Callable[..., dict], *args: object) -> dict:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - recorded, then asserted on
        return _failed(args[0], exc)


def _poll(pred: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"{what} not reached within {timeout:.0f} s")


def _terminal(job_id: str, timeout: float) -> dict[str, str]:
    """Poll scontrol once a second (several jobs are watched at once on a 2-core machine)."""
    info: dict[str, str] = {}

    def done() -> bool:
        nonlocal info
        info = job_info(job_id)
        return info.get("JobState") in TERMINAL

    try:
        _poll(done, timeout, f"job {job_id} terminal", every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last: {info}") from None
    return info


def _ckpt_spec(tmp_path: Path, name: str, **changes: object) -> Path:
    return write_spec(
        "smoke",
        tmp_path / f"{name}.yaml",
        name=name,
        spec__resources__cpus_per_node=1,
        spec__resources__memory="1Gi",
        spec__backends__slurm__output_dir=str(tmp_path / "runs"),
        **changes,
    )


def _submit(spec: Path, tmp_path: Path, venv: Path, **stub_env: str) -> tuple[str, Path]:
    """Submit through `submit_run` (the code `longhaul submit` runs); the stub's settings reach the job by sbatch's
    default --export=ALL."""
    env = {
        **os.environ,
        "LONGHAUL_VENV": str(venv),
        "STUB_CKPT_SHARDS": str(SHARDS),
        "STUB_SHARD_WRITE_S": str(SHARD_WRITE_S),
        "STUB_SHARD_CHUNKS": str(CHUNKS),
        **stub_env,
    }
    res = submit_run(load_spec(spec), submit_dir=tmp_path, environ=env)
    return str(res.job_id), Path(res.run_dir)


def _signal(job_id: str, how: str) -> None:
    argv = ["scontrol", "requeue", job_id] if how == "requeue" else ["scancel", "--batch", "--signal=USR1", job_id]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _has(run_dir: Path, event: str, restart: int, step: int | None = None) -> dict | None:
    return next(
        (
            e
            for e in _events(run_dir)
            if e["event"] == event and e["restart"] == restart and (step is None or e.get("step") == step)
        ),
        None,
    )


# ------------------------------------------------------------------------------------------------- 1


def _ckpt_trial(k: int, tmp_path: Path, venv: Path, stub) -> dict:
    rng = random.Random(CKPT_SEED * 1000 + k)
    how = "requeue" if k % 2 == 0 else "usr1"
    target = 1 + k % 3  # the save that is interrupted (1: no complete checkpoint yet)
    offset = rng.uniform(0.0, 0.9 * WRITE_S)
    spec = _ckpt_spec(tmp_path, f"ckw{k}")
    job_id, run_dir = _submit(spec, tmp_path, venv, STUB_STEPS_AFTER_RESTART="1")
    out = {"trial": k, "how": how, "target": target, "offset": round(offset, 2), "job": job_id}
    try:
        _poll(lambda: _has(run_dir, "ckpt_begin", 0, target), 120, f"trial {k}: save {target} begins")
        time.sleep(offset)
        _signal(job_id, how)
        died = _poll(lambda: _has(run_dir, "exit", 0), 60, f"trial {k}: the first run stops")
        # Nothing writes checkpoints until the requeued job starts again (≈ 11 s): what is on disk now is what
        # the kill left. The newest complete checkpoint is the tracker's step, checked here byte by byte.
        tracker = run_dir / "checkpoints" / TRACKER_FILE
        done = int(tracker.read_text()) if tracker.is_file() else None
        actor = run_dir / "checkpoints" / f"global_step_{done}" / "actor"
        whole = done is None or all(
            (actor / f"model_world_size_{SHARDS}_rank_{r}.pt").read_bytes()
            == b"".join(stub._shard_bytes(done, r, CHUNKS))
            for r in range(SHARDS)
        )
        info = _terminal(job_id, 180)
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState") not in TERMINAL else None)
    ev = _events(run_dir)
    restart = next((e for e in ev if e["event"] == "start" and e["restart"] == 1), {})
    final = [e for e in ev if e["event"] == "exit"][-1]
    out.update(
        state=info.get("JobState"),
        restarts=info.get("Restarts"),
        died=died,
        completed=done,
        whole=whole,
        resumed=restart.get("resume"),
        loaded_ok=restart.get("loaded_ok"),
        step_dirs=restart.get("step_dirs"),
        final=final,
    )
    resumed = restart.get("resume")
    out["mid_write"] = died.get("writing") is not None
    begin = _has(run_dir, "ckpt_begin", 0, target) or {}
    out["at_s"] = round(died.get("t", 0.0) - begin.get("t", 0.0), 2)  # when it stopped, from the save's start
    out["half_written"] = (resumed is not None and (done is None or resumed > done)) or restart.get(
        "loaded_ok"
    ) is False
    out["lost_step"] = done is not None and (resumed is None or resumed < done)
    out["ok"] = (
        info.get("JobState") == "COMPLETED"
        and info.get("Restarts") == "1"
        and whole
        and bool(restart)
        and resumed == done
        and restart.get("loaded_ok") is True
        and final["code"] == 0
        and final["step"] == (done or 0) + 1
        and died["code"] == (143 if how == "requeue" else 75)
    )
    return out


def test_requeue_during_checkpoint_write_resumes_from_newest_complete(slurm_cluster, tmp_path, stub_venv, reliability):
    stub = _stub()
    with ThreadPoolExecutor(CKPT_TRIALS) as pool:
        trials = list(pool.map(lambda k: _guarded(_ckpt_trial, k, tmp_path, stub_venv, stub), range(CKPT_TRIALS)))
    survived = sum(t["ok"] for t in trials)
    lost = sum(t.get("half_written", False) or t.get("lost_step", False) for t in trials)
    reliability(
        AREA,
        "requeue during a checkpoint write (scontrol requeue / pre-limit SIGUSR1)",
        injected=len(trials),
        survived=survived,
        lost=lost,
        lost_what="runs resumed from a half-written checkpoint or lost a completed step",
    )
    summary = [
        {k: t.get(k) for k in ("trial", "how", "target", "at_s", "mid_write", "completed", "resumed", "ok", "error")}
        for t in trials
    ]
    print("\n".join(json.dumps(s) for s in summary))
    assert lost == 0 and survived == len(trials), trials
    # The faults landed where intended: most while a save was being written (the rest just before or after one).
    mid = [t for t in trials if t.get("mid_write")]
    assert len(mid) >= len(trials) // 2, summary
    # A cut-short save was on disk when the job restarted, newer than the step it resumed from.
    assert any(t["step_dirs"] and max(t["step_dirs"]) > (t["resumed"] or 0) for t in mid), trials


# ------------------------------------------------------------------------------------------------- 2


def _limit_job(how: str, tmp_path: Path, venv: Path) -> dict:
    """max_requeues=1: requeue twice (`usr1`: the script's own requeue after the checkpoint signal; `requeue`:
    `scontrol requeue` from outside); the second must stop the job."""
    spec = _ckpt_spec(tmp_path, f"limit-{how}", spec__backends__slurm__max_requeues=1)
    job_id, run_dir = _submit(spec, tmp_path, venv, STUB_SHARD_WRITE_S="0.2")
    try:
        for restart in (0, 1):
            _poll(lambda r=restart: _has(run_dir, "ckpt_end", r), 120, f"{how}: a checkpoint in run {restart}")
            _signal(job_id, how)
            _poll(lambda r=restart: _has(run_dir, "exit", r), 60, f"{how}: run {restart} stops")
        info = _terminal(job_id, 120)
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState") not in TERMINAL else None)
    st = subprocess.run(
        [sys.executable, "-m", "longhaul.cli", "status", str(run_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    from longhaul.checkpoints import latest_step

    tracker = int((run_dir / "checkpoints" / TRACKER_FILE).read_text())
    out = {
        "how": how,
        "job": job_id,
        "info": info,
        "status": st.stdout + st.stderr,
        "status_rc": st.returncode,
        "log": log,
        "starts": [s["restart"] for s in starts],
        "tracker": tracker,
        "latest": latest_step(run_dir / "checkpoints"),
    }
    if how == "usr1":  # "submit the same spec again to resume": a new job (restart count 0) resumes the run
        again, _ = _submit(spec, tmp_path, venv, STUB_SHARD_WRITE_S="0.2", STUB_FIRST_RUN_STEPS=str(tracker + 1))
        try:
            out["again"] = _terminal(again, 120).get("JobState")
        finally:
            cancel_quietly(again if job_info(again).get("JobState") not in TERMINAL else None)
        out["again_resumed"] = next(
            e["resume"] for e in _events(run_dir) if e["event"] == "start" and e["job"] == again
        )
    return out


def test_requeue_limit_stops_the_job_with_a_clear_state(slurm_cluster, tmp_path, stub_venv, reliability):
    with ThreadPoolExecutor(2) as pool:
        jobs = list(pool.map(lambda how: _guarded(_limit_job, how, tmp_path, stub_venv), ["usr1", "requeue"]))
    code = f"{EXIT_REQUEUE_LIMIT}:0"

    def stopped(j: dict) -> bool:
        return "error" not in j and (
            j["info"].get("JobState") == "FAILED"
            and j["info"].get("ExitCode") == code
            and "phase=Failed" in j["status"]
            and "requeue limit reached" in j["status"]
            and "max_requeues=1" in j["status"]
            and j["latest"] == j["tracker"]
            and j["tracker"] >= 1
        )

    past = [j for j in jobs if max(j.get("starts") or [0]) > 1]  # a run started after more requeues than the limit
    reliability(
        AREA,
        "requeued past spec.backends.slurm.max_requeues",
        injected=len(jobs),
        survived=sum(stopped(j) for j in jobs),
        lost=len(past),
        lost_what="runs started past the limit",
    )
    for j in jobs:
        assert stopped(j), {k: v for k, v in j.items() if k != "log"}
        assert "requeue limit reached" in j["log"], j["log"]
    usr1, external = jobs
    # Own requeue: run 0 requeued itself, run 1 saved and stopped instead of requeueing (Restarts stays 1).
    assert usr1["starts"] == [0, 1] and usr1["info"]["Restarts"] == "1" and "not requeueing" in usr1["log"]
    # Submitted again, the run resumes from the checkpoint the stopped job kept.
    assert usr1["again"] == "COMPLETED" and usr1["again_resumed"] == usr1["tracker"], usr1
    # Requeued from outside: the third start (restart 2 > 1) stopped before the launcher ran.
    assert external["starts"] == [0, 1] and external["info"]["Restarts"] == "2"
    assert "without running" in external["log"]
    assert not past


# ------------------------------------------------------------------------------------------------- 3

#: One `longhaul submit` process: imports the CLI first, then waits for the go file, so that all N submits start
#: the submission itself at the same instant (process start-up on a loaded 2-core machine would spread them).
RACER = """
import os, sys, time
import longhaul.cli, longhaul.commands.submit, longhaul.submit.slurm, longhaul.spec
go, ready = sys.argv[1], sys.argv[2]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
sys.argv = ["longhaul", *sys.argv[3:]]
longhaul.cli.main()
"""


def _race(spec: Path, tmp_path: Path, n: int, env: dict[str, str], tag: str) -> list[subprocess.CompletedProcess]:
    racer = tmp_path / "racer.py"
    racer.write_text(RACER)
    go = tmp_path / f"go-{tag}"
    ready = [tmp_path / f"ready-{tag}-{i}" for i in range(n)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(racer), str(go), str(ready[i]), "submit", "--backend", "slurm", str(spec)],
            cwd=tmp_path,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        _poll(lambda: all(r.exists() for r in ready), 240, f"{n} submit processes ready", every=0.1)
        go.touch()
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs, strict=True)]


def _jobs_named(name: str) -> list[str]:
    """Distinct job ids (an array's: its array job id) of every job named `name` that slurmctld knows, whatever
    its state (finished ones stay listed for MinJobAge): what was created, not only what is queued right now."""
    proc = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=60, check=True)
    jobs = [parse_scontrol(line) for line in proc.stdout.splitlines() if line.strip()]
    return sorted({j.get("ArrayJobId") or j["JobId"] for j in jobs if j.get("JobName") == name})


def _race_trial(tag: str, tmp_path: Path, venv: Path, seeds: list[int] | None, n: int) -> dict:
    changes: dict[str, object] = {"spec__algorithm__seed": DROP, "spec__algorithm__seeds": seeds} if seeds else {}
    spec = _ckpt_spec(tmp_path, f"race-{tag}", **changes)
    exp = load_spec(spec)
    name = run_name(exp)
    try:
        results = _race(spec, tmp_path, n, {"LONGHAUL_VENV": str(venv)}, tag)
    finally:
        jobs = _jobs_named(name)
        for job in jobs:
            cancel_quietly(job)
    won = [r for r in results if r.returncode == 0]
    refused = [r for r in results if r.returncode != 0]
    message = "still queued or running" if seeds else "already has job"
    run_dirs = [tmp_path / slurm_run_dir(r) for r in seed_runs(exp)]
    records = [json.loads((d / "submit.json").read_text()) if (d / "submit.json").is_file() else {} for d in run_dirs]
    return {
        "trial": tag,
        "jobs": jobs,
        "won": [r.stdout.strip() for r in won],
        "errors": [r.stderr[-600:] for r in refused if message not in r.stderr],
        "history": [rec.get("history") for rec in records],
        "ok": len(jobs) == 1
        and len(won) == 1
        and won[0].stdout.strip() == jobs[0]
        and all(message in r.stderr for r in refused)
        and all(len(rec.get("history", [])) == 1 for rec in records),
    }


@pytest.mark.parametrize("kind", ["one run", "multi-seed job array"])
def test_concurrent_submits_make_one_job(slurm_cluster, tmp_path, stub_venv, reliability, kind):
    array = kind != "one run"
    n = RACE_ARRAY_N if array else RACE_N
    trials = [
        _guarded(_race_trial, f"{'arr' if array else 'one'}{k}", tmp_path, stub_venv, [1, 2] if array else None, n)
        for k in range(RACE_ARRAY_TRIALS if array else RACE_TRIALS)
    ]
    duplicates = sum(max(0, len(t.get("jobs", [])) - 1) for t in trials)
    reliability(
        AREA,
        f"{n} concurrent `longhaul submit` of one spec ({kind})",
        injected=n * len(trials),
        survived=n * sum(t["ok"] for t in trials),
        lost=duplicates,
        lost_what="duplicate jobs",
    )
    assert duplicates == 0 and all(t["ok"] for t in trials), trials
