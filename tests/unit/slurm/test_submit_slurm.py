"""Slurm adapter: parsing of real scontrol output, state → phase, pre-flight refusals, dry run (no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from longhaul.spec.models import Experiment
from longhaul.submit import BackendUnavailable, backend_of_run, get_backend, read_run_progress
from longhaul.submit.slurm import PHASES, SlurmError, parse_scontrol, phase_of, submit_run

REPO = Path(__file__).resolve().parents[3]

# Captured from the CI cluster (Slurm 22.05.8): a finished health-check job.
SCONTROL_LINE = (
    "JobId=3 JobName=longhaul-health UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 "
    "Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-29T11:46:53 "
    "AllocNode:Sid=localhost:6510 ReqNodeList=(null) NodeList=localhost NumCPUs=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Command=(null) WorkDir=/work/main "
    "StdErr=/tmp/longhaul-slurm-health/3.out StdIn=/dev/null StdOut=/tmp/longhaul-slurm-health/3.out Power= "
    "TresPerNode=gres:gpu:2"
)


def test_parse_scontrol_line() -> None:
    kv = parse_scontrol(SCONTROL_LINE)
    assert kv["JobState"] == "COMPLETED" and kv["ExitCode"] == "0:0" and kv["Restarts"] == "0"
    assert kv["TRES"] == "cpu=1,node=1,billing=1" and kv["AllocNode:Sid"] == "localhost:6510"
    assert kv["CPUs/Task"] == "1" and kv["Power"] == "" and kv["TresPerNode"] == "gres:gpu:2"
    assert kv["StdOut"] == "/tmp/longhaul-slurm-health/3.out"


def test_reason_with_spaces_is_kept_whole() -> None:
    kv = parse_scontrol("JobId=9 JobState=PENDING Reason=launch failed requeued held Dependency=(null)")
    assert kv["Reason"] == "launch failed requeued held" and kv["Dependency"] == "(null)"


@pytest.mark.parametrize(
    "state,phase,terminal",
    [
        ("PENDING", "Pending", False),
        ("RUNNING", "Running", False),
        ("COMPLETING", "Running", False),
        ("REQUEUED", "Pending", False),
        ("COMPLETED", "Succeeded", True),
        ("FAILED", "Failed", True),
        ("TIMEOUT", "Failed", True),
        ("CANCELLED", "Failed", True),
        ("CANCELLED by 0", "Failed", True),
        ("OUT_OF_MEMORY", "Failed", True),
        ("NODE_FAIL", "Failed", True),
        ("FOO", "Unknown", False),
    ],
)
def test_phase_of(state: str, phase: str, terminal: bool) -> None:
    assert phase_of(state) == (phase, terminal)


def test_preempted_is_a_pause_only_when_requeued() -> None:
    assert phase_of("PREEMPTED", requeue=True) == ("Pending", False)
    assert phase_of("PREEMPTED", requeue=False) == ("Failed", True)
    assert {p for p, _ in PHASES.values()} == {"Pending", "Running", "Succeeded", "Failed"}


def _exp(**slurm: object) -> Experiment:
    doc = yaml.safe_load((REPO / "specs/smoke.yaml").read_text())
    doc["spec"]["backends"]["slurm"].update(slurm)
    return Experiment.model_validate(doc)


def _never(*_a, **_k):
    raise AssertionError("no command may run")


def test_dry_run_writes_and_runs_nothing(tmp_path: Path) -> None:
    res = submit_run(_exp(), dry_run=True, submit_dir=tmp_path, runner=_never)
    assert res.dry_run and res.job_id is None and res.script.startswith("#!/bin/bash")
    assert not any(tmp_path.iterdir())


def test_refuses_without_a_venv(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="spec.backends.slurm.venv"):
        submit_run(_exp(), submit_dir=tmp_path, environ={"LONGHAUL_VENV": str(tmp_path / "nope")}, runner=_never)
    assert not any(tmp_path.iterdir())


def test_refuses_container_without_image(tmp_path: Path) -> None:
    with pytest.raises(SlurmError, match="LONGHAUL_IMAGE"):
        submit_run(_exp(container={"runtime": "apptainer"}), submit_dir=tmp_path, environ={}, runner=_never)


def test_backend_dispatch_errors(tmp_path: Path) -> None:
    assert get_backend("slurm").__name__ == "longhaul.submit.slurm"
    with pytest.raises(BackendUnavailable, match="valid: slurm, kubernetes, local"):
        get_backend("nomad")
    with pytest.raises(BackendUnavailable, match="submit.json missing"):
        backend_of_run(tmp_path)
    (tmp_path / "submit.json").write_text(json.dumps({"backend": "slurm", "job_id": "1"}))
    assert backend_of_run(tmp_path) == "slurm"


def test_run_progress_from_launcher_files(tmp_path: Path) -> None:
    assert read_run_progress(tmp_path) == {"stages_done": [], "checkpoint_step": None}
    (tmp_path / ".longhaul/stages").mkdir(parents=True)
    (tmp_path / ".longhaul/stages/grpo.done").write_text("")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints/latest_checkpointed_iteration.txt").write_text("2\n")
    assert read_run_progress(tmp_path) == {"stages_done": ["grpo"], "checkpoint_step": 2}
