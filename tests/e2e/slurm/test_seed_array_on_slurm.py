"""Training seeds as a Slurm job array on the real cluster, with the protocol stub as the launcher (≈ 40 s).

What is real: `longhaul submit/status/logs`, the rendered array script, sbatch, the array tasks, the USR1 trap,
`scontrol requeue` of one task, Slurm's requeue and restart. The stand-in is the process behind `longhaul launch`
(tests/e2e/slurm/stub_launcher.py), which records the seed of the spec it was started with.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from longhaul.render.slurm import TASK_JOB_ID_FILE, slurm_run_dir
from longhaul.spec import load_spec, run_name, seed_runs
from longhaul.submit.slurm import fetch_status

from .conftest import DROP, TERMINAL, cancel_quietly, job_info, longhaul, wait_job, write_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SEEDS = [7, 8, 9]


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "stub-events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _step(run_dir: Path) -> int:
    text = (run_dir / "stub.ckpt").read_text().strip() if (run_dir / "stub.ckpt").is_file() else ""
    return int(text) if text.isdigit() else 0


def test_seeds_run_as_one_array_and_one_task_requeues_alone(slurm_cluster, tmp_path, stub_venv):
    spec = write_spec(
        "smoke",
        tmp_path / "mech-seeds.yaml",
        name="mech-seeds",
        spec__algorithm__seed=DROP,
        spec__algorithm__seeds=SEEDS,
        spec__backends__slurm__output_dir=str(tmp_path / "runs"),
    )
    exp = load_spec(spec)
    group = run_name(exp)
    run_dirs = [Path(slurm_run_dir(r)) for r in seed_runs(exp)]
    assert [d.name for d in run_dirs] == [f"{group}-s{s}" for s in SEEDS]
    # Tasks that are not signalled finish after 30 stub steps (15 s); a restarted task after 4 more.
    env = {"LONGHAUL_VENV": str(stub_venv), "STUB_FIRST_RUN_STEPS": "30"}
    proc = longhaul("submit", "--backend", "slurm", str(spec), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    array_id = proc.stdout.strip()
    assert array_id.isdigit(), proc.stdout
    tasks = [f"{array_id}_{i}" for i in range(len(SEEDS))]
    try:
        for task, d in zip(tasks, run_dirs, strict=True):
            wait_job(task, lambda i, d=d: i.get("JobState") == "RUNNING" and _step(d) >= 3, 60, "running, step >= 3")
        # Requeue the task that carries the array's own job id: `scontrol requeue $SLURM_JOB_ID` there would
        # requeue every task of the array.
        (k,) = [i for i, t in enumerate(tasks) if job_info(t).get("JobId") == array_id]
        again = longhaul("submit", "--backend", "slurm", str(spec), cwd=tmp_path, env=env)
        assert again.returncode != 0 and "still queued or running" in again.stderr, again
        assert f"scancel {array_id}" in again.stderr
        # Slurm's pre-limit signal path: USR1 to this task's batch shell only.
        subprocess.run(["scancel", "--batch", "--signal=USR1", tasks[k]], check=True, capture_output=True, timeout=30)
        infos = [wait_job(t, lambda i: i.get("JobState") in TERMINAL, 120, "a terminal state") for t in tasks]
    finally:
        cancel_quietly(array_id if any(job_info(t).get("JobState") not in TERMINAL for t in tasks) else None)

    for i, (task, d, info, seed) in enumerate(zip(tasks, run_dirs, infos, SEEDS, strict=True)):
        assert info["JobState"] == "COMPLETED", info
        assert info["Restarts"] == ("1" if i == k else "0"), (i, k, info)  # only task k was requeued
        record = json.loads((d / "submit.json").read_text())
        assert record["job_id"] == task and record["seed"] == seed and record["seed_group"] == group
        assert (d / TASK_JOB_ID_FILE).read_text().strip() == info["JobId"]
        ev = _events(d)
        starts = [e for e in ev if e["event"] == "start"]
        exits = [e for e in ev if e["event"] == "exit"]
        # Each task ran its own seed run: its directory, its mounted spec (with its seed), its job variables.
        for s in starts:
            assert s["argv"] == ["launch", "--spec", f"{d}/experiment.yaml", "--backend", "slurm", "--run-dir", str(d)]
            assert (s["seed"], s["run_name"], s["job_id"], s["array_task"]) == (seed, d.name, task, str(i))
        if i == k:
            ckpts = [e for e in ev if e["event"] == "checkpoint"]
            assert [s["restart"] for s in starts] == [0, 1] and ckpts[0]["why"] == "SIGUSR1"
            assert exits[0]["code"] == 75 and starts[1]["step"] == exits[0]["step"] > 0  # resumed, not restarted
            assert exits[-1]["code"] == 0
        else:
            assert [s["restart"] for s in starts] == [0] and [e["code"] for e in exits] == [0], ev
        assert fetch_status(d)["job"]["phase"] == "Succeeded"
    log_k = (tmp_path / "runs" / group / f"slurm-{tasks[k]}.out").read_text()
    assert f"requeueing job {tasks[k]}" in log_k and log_k.count("longhaul: job ") == 2

    st = longhaul("status", str(spec), cwd=tmp_path)
    assert st.returncode == 0, st.stderr
    lines = [line for line in st.stdout.splitlines() if not line.startswith("  memory plan: ")]
    assert [line.split()[0] for line in lines] == [d.name for d in run_dirs]
    assert all("phase=Succeeded" in line and "state=COMPLETED" in line for line in lines), lines
    st_json = json.loads(longhaul("status", "--json", str(spec), cwd=tmp_path).stdout)
    assert [s["job"]["job_id"] for s in st_json] == tasks and [s["seed"] for s in st_json] == SEEDS
    logs = longhaul("logs", str(spec), cwd=tmp_path)
    assert logs.returncode == 2 and all(str(d) in logs.stderr for d in run_dirs), logs.stderr
    logs = longhaul("logs", str(run_dirs[k]), cwd=tmp_path)
    assert logs.returncode == 0 and logs.stdout == log_k
