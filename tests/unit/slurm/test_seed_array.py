"""Training seeds on Slurm: one job-array script per group, its submission, status and logs per seed run.

No cluster: the script is executed with bash (SLURM_ARRAY_* set by hand), and the submit/status path runs
against small fake `sbatch`/`scontrol`/`squeue`/`sacct` programs on PATH that answer from files.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from longhaul.cli import app
from longhaul.render import render
from longhaul.render.slurm import TASK_JOB_ID_FILE, render_slurm, slurm_run_dir
from longhaul.spec import load_spec, parse_spec_text, run_name, seed_runs
from longhaul.spec.models import Experiment
from longhaul.submit.slurm import SlurmError, fetch_accounting, fetch_logs, fetch_status, submit_run
from support.slurm import fake_venv, sbatch_directives

REPO = Path(__file__).resolve().parents[3]


def _seeds_spec(seeds: list[int], base: str = "smoke", **slurm: object) -> str:
    doc = yaml.safe_load((REPO / f"specs/{base}.yaml").read_text(encoding="utf-8"))
    doc["spec"]["algorithm"].pop("seed")
    doc["spec"]["algorithm"]["seeds"] = seeds
    doc["spec"].setdefault("backends", {}).setdefault("slurm", {}).update(slurm)
    return yaml.safe_dump(doc, sort_keys=False)


def _exp(seeds: list[int], base: str = "smoke", **slurm: object) -> Experiment:
    return parse_spec_text(_seeds_spec(seeds, base, **slurm), file="seeds.yaml")


# ------------------------------------------------------------------------------------------------- render


def test_one_array_script_named_after_the_group(tmp_path: Path) -> None:
    exp = _exp([7, 8, 11])
    script = render_slurm(exp)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    d = sbatch_directives(script)
    group = run_name(exp)
    assert d["job-name"] == group and d["array"] == "0-2"
    # Task logs in the group's directory, one file per task; everything else as for a single run.
    assert d["output"] == f"{slurm_run_dir(exp)}/slurm-%A_%a.out" == f"runs/{group}/slurm-%A_%a.out"
    assert d["open-mode"] == "append" and "requeue" in d and d["signal"] == "B:USR1@600"
    # The seeds and each seed run's name and run directory, as computed for the seed run itself.
    runs = seed_runs(exp)
    assert "LH_SEEDS=(7 8 11)" in script
    assert f"LH_RUN_DIRS=({' '.join(slurm_run_dir(r) for r in runs)})" in script
    assert f"LH_RUN_NAMES=({' '.join(run_name(r) for r in runs)})" in script
    assert [slurm_run_dir(r) for r in runs] == [f"runs/{group}-s{s}" for s in (7, 8, 11)]
    # The requeue names this task, never the raw id (the array's own id would requeue every task).
    assert 'scontrol requeue "$LONGHAUL_JOB_ID"' in script and 'requeue "$SLURM_JOB_ID"' not in script
    # `longhaul render --backend slurm` gives this one script, named after the group.
    assert render(exp, "slurm").files == {f"{group}.sbatch": script}


def test_one_seed_is_still_a_seed_run() -> None:
    exp = _exp([5])
    script = render_slurm(exp)
    assert sbatch_directives(script)["array"] == "0-0"
    assert f"LH_RUN_NAMES=({run_name(exp)}-s5)" in script


def test_stage_and_dependency_apply_to_every_task() -> None:
    script = render_slurm(_exp([1, 2]), stage="eval", dependency="afterok:9")
    d = sbatch_directives(script)
    assert d["output"].endswith("/slurm-eval-%A_%a.out") and d["dependency"] == "afterok:9"
    assert "export LONGHAUL_STAGE=eval" in script and "--stage eval &" in script


def test_multi_node_tasks_bring_up_their_own_ray(tmp_path: Path) -> None:
    exp = _exp([1, 2], "lata", container={"runtime": "apptainer", "image": "/sif/l.sif"})
    doc = exp.model_dump(mode="json", exclude_unset=True)
    doc["spec"]["resources"]["nodes"] = 2
    script = render_slurm(Experiment.model_validate(doc))
    assert sbatch_directives(script)["nodes"] == "2" and sbatch_directives(script)["array"] == "0-1"
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # Token file and launcher in the task's own run directory; the variables are set before the Ray block.
    assert script.index('LH_RUN_DIR="${LH_RUN_DIRS[$LH_TASK]}"') < script.index("export LONGHAUL_RUN_DIR=")
    assert script.index("export LONGHAUL_RUN_DIR=") < script.index('RAY_AUTH_TOKEN_PATH="$LONGHAUL_RUN_DIR/')
    launch = 'longhaul launch --spec "$LH_RUN_DIR"/experiment.yaml'
    assert f'-w "$LH_HEAD" "${{PYXIS[@]}}" "${{CONTAINER[@]}}" {launch}' in script
    assert '--env "LONGHAUL_JOB_ID=${LONGHAUL_JOB_ID:-}"' in script


def _bash(script: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "HOME": str(cwd), "SLURM_SUBMIT_DIR": str(cwd), **env}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=full, capture_output=True, text=True, timeout=60)


def test_each_task_runs_its_seed_run_with_values_passed_verbatim(tmp_path: Path) -> None:
    """Execute the array script as tasks 0 and 1: each launches its own seed run (odd but valid characters in
    the output directory reach argv unchanged), and an index without a seed stops before anything runs."""
    dump = tmp_path / "dump"
    dump.mkdir()
    venv = fake_venv(
        tmp_path,
        (
            "import json, os, sys, yaml\n"
            "spec = yaml.safe_load(open(sys.argv[sys.argv.index('--spec') + 1]))\n"
            f"json.dump({{'argv': sys.argv[1:], 'seed': spec['spec']['algorithm']['seed'],"
            " 'env': {k: v for k, v in os.environ.items() if k.startswith('LONGHAUL_')}},"
            f" open(os.path.join({str(dump)!r}, os.environ['SLURM_ARRAY_TASK_ID'] + '.json'), 'w'))\n"
        ),
    )
    out_dir = f"{tmp_path}/o=1,x+y@z-"
    exp = _exp([7, 8], venv=str(venv), output_dir=out_dir)
    runs = seed_runs(exp)
    for r in runs:  # what the submit step prepares
        Path(slurm_run_dir(r)).mkdir(parents=True)
        Path(slurm_run_dir(r), "experiment.yaml").write_text(yaml.safe_dump(r.model_dump(mode="json")))
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(exp))
    for task, (r, seed) in enumerate(zip(runs, (7, 8), strict=True)):
        proc = _bash(
            script, tmp_path, SLURM_JOB_ID=str(500 + task), SLURM_ARRAY_JOB_ID="500", SLURM_ARRAY_TASK_ID=str(task)
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads((dump / f"{task}.json").read_text())
        run_dir = slurm_run_dir(r)
        assert run_dir == f"{out_dir}/{run_name(exp)}-s{seed}"
        assert got["argv"] == [
            "launch",
            "--spec",
            f"{run_dir}/experiment.yaml",
            "--backend",
            "slurm",
            "--run-dir",
            run_dir,
        ]
        assert got["seed"] == seed
        assert got["env"] == {
            **got["env"],
            "LONGHAUL_RUN_NAME": run_name(r),
            "LONGHAUL_RUN_DIR": run_dir,
            "LONGHAUL_SPEC": f"{run_dir}/experiment.yaml",
            "LONGHAUL_JOB_ID": f"500_{task}",
        }
        assert Path(run_dir, TASK_JOB_ID_FILE).read_text() == f"{500 + task}\n"
        assert f"array task {task}: training seed {seed}, run {run_name(r)} in {run_dir}" in proc.stderr
        assert f"longhaul: job 500_{task} restart 0" in proc.stderr and f"--run-dir {run_dir}" in proc.stderr
    proc = _bash(script, tmp_path, SLURM_JOB_ID="9", SLURM_ARRAY_JOB_ID="9", SLURM_ARRAY_TASK_ID="2")
    assert proc.returncode != 0 and "array task 2 has no training seed (valid: 0-1)" in proc.stderr
    proc = _bash(script, tmp_path, SLURM_JOB_ID="9")
    assert proc.returncode != 0 and "this script is a job array" in proc.stderr
    assert sorted(p.name for p in dump.iterdir()) == ["0.json", "1.json"]


@pytest.mark.parametrize("array", [True, False])
def test_checkpoint_signal_requeues_this_task_only(tmp_path: Path, array: bool) -> None:
    """USR1 → the launcher saves and exits 75 → `scontrol requeue <array id>_<task>` (a plain job: its id)."""
    calls = tmp_path / "scontrol.args"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    # The launcher asks its batch shell for the pre-limit signal, which the trap forwards back to it.
    venv = fake_venv(
        tmp_path,
        (
            "import os, signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))\n"
            "os.kill(os.getppid(), signal.SIGUSR1)\n"
            "time.sleep(30)\nsys.exit(1)\n"
        ),
    )
    exp = _exp([7, 8], venv=str(venv), output_dir=str(tmp_path / "runs"))
    if not array:
        exp = seed_runs(exp)[1]  # a seed run alone is a plain single-run script
    for r in seed_runs(exp):
        Path(slurm_run_dir(r)).mkdir(parents=True)
    script = tmp_path / "job.sbatch"
    script.write_text(render_slurm(exp))
    proc = _bash(
        script,
        tmp_path,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        SLURM_JOB_ID="600",
        **({"SLURM_ARRAY_JOB_ID": "599", "SLURM_ARRAY_TASK_ID": "1"} if array else {}),
    )
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text() == ("requeue 599_1\n" if array else "requeue 600\n")
    assert f"requeueing job {'599_1' if array else '600'}" in proc.stderr


def test_a_spec_without_seeds_renders_as_before() -> None:
    exp = load_spec(REPO / "specs/smoke.yaml")
    script = render_slurm(exp)
    assert "--array" not in script and "LH_SEEDS" not in script and 'scontrol requeue "$SLURM_JOB_ID"' in script
    assert (REPO / "tests/golden/smoke/slurm.sbatch").read_text() == script


# ------------------------------------------------------------------------------------------------- submit


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake Slurm client commands on PATH. State: <dir>/<id>.scontrol (a `scontrol show job -o` line),
    <dir>/<id>.sacct (`sacct -c` rows); calls are appended to <dir>/calls; sbatch prints <dir>/next_id."""
    state = tmp_path / "fake-slurm"
    (state / "bin").mkdir(parents=True)
    progs = {
        "sbatch": f'echo "sbatch $*" >> {state}/calls\ncat {state}/next_id\n',
        "scontrol": (
            f'echo "scontrol $*" >> {state}/calls\nid="$4"\n'
            f'if [ -f "{state}/$id.scontrol" ]; then cat "{state}/$id.scontrol"; exit 0; fi\n'
            'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n'
        ),
        "squeue": f'echo "squeue $*" >> {state}/calls\nexit 1\n',
        "sacct": (
            f'echo "sacct $*" >> {state}/calls\n'
            'case "$1" in -X) echo "Slurm accounting storage is disabled" >&2; exit 1;; esac\n'
            f'id="$5"; [ -f "{state}/$id.sacct" ] && cat "{state}/$id.sacct"; exit 0\n'
        ),
    }
    for name, body in progs.items():
        (state / "bin" / name).write_text(f"#!/bin/sh\n{body}")
        (state / "bin" / name).chmod(0o755)
    (state / "next_id").write_text("4242\n")
    monkeypatch.setenv("PATH", f"{state / 'bin'}:{os.environ['PATH']}")
    return state


def _scontrol_line(job: str, state: str, raw: str | None = None) -> str:
    array, _, task = job.partition("_")
    return (
        f"JobId={raw or array} ArrayJobId={array} ArrayTaskId={task} JobName=x JobState={state} Reason=None "
        "Requeue=1 Restarts=0 ExitCode=0:0 RunTime=00:00:05 TimeLimit=00:30:00 StdOut=/x.out\n"
    )


def _submit(exp: Experiment, cwd: Path, venv: Path):
    return submit_run(exp, submit_dir=cwd, environ={**os.environ, "LONGHAUL_VENV": str(venv)})


def test_submit_prepares_every_seed_run_and_submits_once(tmp_path: Path, fake_slurm: Path) -> None:
    venv = fake_venv(tmp_path, "")
    exp = _exp([7, 8])
    group = run_name(exp)
    dry = submit_run(exp, dry_run=True, submit_dir=tmp_path)
    assert dry.dry_run and dry.script == render_slurm(exp) and not (tmp_path / "runs").exists()
    res = _submit(exp, tmp_path, venv)
    assert res.job_id == "4242" and res.run_name == group and res.script == render_slurm(exp)
    assert res.script_path == str(tmp_path / "runs" / group / f"{group}.sbatch")
    assert Path(res.script_path).read_text() == res.script
    sbatch = [c for c in (fake_slurm / "calls").read_text().splitlines() if c.startswith("sbatch")]
    assert sbatch == [f"sbatch --parsable {res.script_path}"]
    for i, (r, seed) in enumerate(zip(seed_runs(exp), (7, 8), strict=True)):
        run_dir = tmp_path / slurm_run_dir(r)
        assert run_dir == tmp_path / "runs" / f"{group}-s{seed}"
        mounted = load_spec(run_dir / "experiment.yaml")
        assert mounted.spec.algorithm.seed == seed and run_name(mounted) == run_dir.name
        rec = json.loads((run_dir / "submit.json").read_text())
        assert rec == {
            **rec,
            "backend": "slurm",
            "run_name": run_dir.name,
            "job_id": f"4242_{i}",
            "history": [f"4242_{i}"],
            "seed": seed,
            "seed_group": group,
            "array_job_id": "4242",
            "array_task": i,
            "log": str(tmp_path / "runs" / group / f"slurm-4242_{i}.out"),
        }
        assert (run_dir / rec["script"]).resolve() == Path(res.script_path)
        assert not list(run_dir.glob("*.sbatch"))
    assert f"{group}-s7 (task 0), {group}-s8 (task 1)" in res.message


def test_resubmit_refused_while_a_task_is_live_then_appends_history(tmp_path: Path, fake_slurm: Path) -> None:
    venv = fake_venv(tmp_path, "")
    exp = _exp([7, 8])
    _submit(exp, tmp_path, venv)
    (fake_slurm / "4242_0.scontrol").write_text(_scontrol_line("4242_0", "COMPLETED", "4243"))
    (fake_slurm / "4242_1.scontrol").write_text(_scontrol_line("4242_1", "RUNNING", "4242"))
    (fake_slurm / "next_id").write_text("5000\n")
    with pytest.raises(SlurmError, match=r"-s8 has job 4242_1 \(RUNNING\).*scancel 4242` first"):
        _submit(exp, tmp_path, venv)
    assert sum(c.startswith("sbatch") for c in (fake_slurm / "calls").read_text().splitlines()) == 1
    (fake_slurm / "4242_1.scontrol").write_text(_scontrol_line("4242_1", "FAILED", "4242"))
    assert _submit(exp, tmp_path, venv).job_id == "5000"
    rec = json.loads((tmp_path / slurm_run_dir(seed_runs(exp)[1]) / "submit.json").read_text())
    assert rec["job_id"] == "5000_1" and rec["history"] == ["4242_1", "5000_1"]


def test_status_and_logs_follow_one_task(tmp_path: Path, fake_slurm: Path) -> None:
    venv = fake_venv(tmp_path, "")
    exp = _exp([7, 8])
    _submit(exp, tmp_path, venv)
    run_dir = tmp_path / slurm_run_dir(seed_runs(exp)[1])
    (fake_slurm / "4242_1.scontrol").write_text(_scontrol_line("4242_1", "RUNNING", "4244"))
    st = fetch_status(run_dir)
    assert st["job"]["job_id"] == "4242_1" and st["job"]["phase"] == "Running" and st["seed"] == 8
    assert st["seed_group"] == run_name(exp) and st["run_name"] == run_dir.name
    Path(json.loads((run_dir / "submit.json").read_text())["log"]).write_text("task 1 says hi\n")
    (fake_slurm / "4242_1.scontrol").write_text(_scontrol_line("4242_1", "COMPLETED", "4244"))
    assert "".join(fetch_logs(run_dir, follow=True, poll_s=0.01)) == "task 1 says hi\n"


def test_accounting_names_an_array_task_by_its_raw_id(tmp_path: Path, fake_slurm: Path) -> None:
    """After MinJobAge only the completion log answers, and it knows a task by its raw id: asked for
    `4242_1` it would answer for job 4242 (another task). Without the raw id the state stays Unknown."""
    venv = fake_venv(tmp_path, "")
    exp = _exp([7, 8])
    _submit(exp, tmp_path, venv)
    run_dir = tmp_path / slurm_run_dir(seed_runs(exp)[1])
    (fake_slurm / "4242.sacct").write_text("4242|FAILED|3:0|00:00:09\n")
    (fake_slurm / "4244.sacct").write_text("4244|PENDING|0:0|00:00:03\n4244|COMPLETED|0:0|00:00:20\n")
    assert fetch_status(run_dir)["job"]["phase"] == "Unknown"
    (run_dir / TASK_JOB_ID_FILE).write_text("4244\n")  # what the task writes when it starts
    job = fetch_status(run_dir)["job"]
    assert (job["state"], job["phase"], job["source"]) == ("COMPLETED", "Succeeded", "sacct -c")
    assert fetch_accounting("4242").state == "FAILED"  # a plain job id is asked as it is


# ------------------------------------------------------------------------------------------------- CLI


def _cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_cli_status_lists_seed_runs_and_logs_asks_for_one(
    tmp_path: Path, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "seeds.yaml"
    spec.write_text(_seeds_spec([7, 8, 9]))
    exp = load_spec(spec)
    names = [run_name(r) for r in seed_runs(exp)]
    code, _, err = _cli("status", str(spec))
    assert code == 1 and "no run of this spec has been submitted" in err and f"runs/{names[2]}" in err
    venv = fake_venv(tmp_path, "")
    _submit(exp, tmp_path, venv)
    for i, state in enumerate(("COMPLETED", "RUNNING")):
        (fake_slurm / f"4242_{i}.scontrol").write_text(_scontrol_line(f"4242_{i}", state))
    (tmp_path / "runs" / names[2] / "submit.json").unlink()  # as if that seed run were never submitted here
    code, out, err = _cli("status", str(spec))
    assert code == 0, err
    lines = [line for line in out.splitlines() if not line.startswith("  memory plan: ")]
    assert len(lines) == 3
    assert out.count("  memory plan: ") == 2  # one per submitted seed run, from its resolved spec
    assert lines[0].startswith(f"{names[0]}  phase=Succeeded  state=COMPLETED  job=4242_0")
    assert lines[1].startswith(f"{names[1]}  phase=Running  state=RUNNING  job=4242_1")
    assert lines[2] == f"{names[2]}  not submitted from here"
    code, out, _ = _cli("status", "--json", str(spec))
    got = json.loads(out)
    assert code == 0 and [s["run_name"] for s in got] == names and got[2]["submitted"] is False
    assert [s["seed"] for s in got[:2]] == [7, 8]
    # A seed run by directory or by run name: the single-run output.
    code, out, _ = _cli("status", "--json", names[1])
    assert code == 0 and json.loads(out)["job"]["job_id"] == "4242_1"
    code, _, err = _cli("logs", str(spec))
    assert code == 2 and "3 training seeds, one run each; name one run directory" in err
    assert all(f"runs/{n}" in err for n in names)
    Path(json.loads((tmp_path / "runs" / names[0] / "submit.json").read_text())["log"]).write_text("seed 7 log\n")
    code, out, _ = _cli("logs", f"runs/{names[0]}")
    assert code == 0 and out == "seed 7 log\n"


def test_cli_single_run_status_is_unchanged(tmp_path: Path, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "one.yaml"
    spec.write_text((REPO / "specs/smoke.yaml").read_text())
    code, _, err = _cli("status", str(spec))
    assert code == 1 and "this spec has not been submitted from here" in err
    exp = load_spec(spec)
    _submit(exp, tmp_path, fake_venv(tmp_path, ""))
    (fake_slurm / "4242.scontrol").write_text(_scontrol_line("4242", "RUNNING").replace("ArrayTaskId= ", ""))
    code, out, _ = _cli("status", "--json", str(spec))
    st = json.loads(out)
    assert code == 0 and st["run_name"] == run_name(exp) and st["job"]["job_id"] == "4242" and "seed" not in st
    code, out, _ = _cli("status", str(spec))
    assert code == 0 and out.startswith(f"{run_name(exp)}  phase=Running  state=RUNNING  job=4242")
