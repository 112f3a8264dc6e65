"""Experiment status from stage workloads (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from longhaul.k8s import status as S

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T01:00:00Z"


def job(**status: Any) -> dict[str, Any]:
    return {"kind": "Job", "spec": {"completions": 1, "backoffLimit": 0}, "status": status,
            "metadata": {"annotations": status.pop("annotations", {})}}


@pytest.mark.parametrize(("obj", "phase"), [
    (None, S.Phase.PENDING),
    (job(), S.Phase.PENDING),
    (job(active=1), S.Phase.PENDING),  # pods exist but none is ready (e.g. unschedulable)
    (job(active=1, ready=1), S.Phase.RUNNING),
    (job(succeeded=1), S.Phase.SUCCEEDED),
    (job(failed=1), S.Phase.FAILED),
    (job(conditions=[{"type": "Complete", "status": "True"}]), S.Phase.SUCCEEDED),
    (job(conditions=[{"type": "Failed", "status": "True"}]), S.Phase.FAILED),
    (job(conditions=[{"type": "Failed", "status": "False"}], active=1, ready=1), S.Phase.RUNNING),
    ({"kind": "RayJob", "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}, S.Phase.RUNNING),
    ({"kind": "RayJob", "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}, S.Phase.SUCCEEDED),
    ({"kind": "RayJob", "status": {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}}, S.Phase.FAILED),
    ({"kind": "RayJob", "status": {}}, S.Phase.PENDING),
    ({"kind": "JobSet", "status": {"conditions": [{"type": "Completed", "status": "True"}]}}, S.Phase.SUCCEEDED),
    ({"kind": "JobSet", "status": {"conditions": [{"type": "Failed", "status": "True"}]}}, S.Phase.FAILED),
    ({"kind": "JobSet", "status": {"replicatedJobsStatus": [{"active": 2}]}}, S.Phase.RUNNING),
])
def test_workload_phase(obj: dict[str, Any] | None, phase: S.Phase) -> None:
    assert S.workload_phase(obj) == phase


def views(*workloads: dict[str, Any] | None) -> list[S.StageView]:
    stages = ["grpo", "eval"]
    return [S.StageView(stage=s, name=f"run-{s}", workload=w) for s, w in zip(stages, workloads, strict=True)]


def build(prev: dict[str, Any] | None, *workloads: dict[str, Any] | None, now: str = NOW) -> S.Reconciled:
    return S.build_status(prev, views(*workloads), run_name="run", spec_hash="abc", generation=3, now=now)


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_first_stage_is_created_first_and_stages_run_in_order() -> None:
    r = build(None, None, None)
    assert r.next_stage == "grpo" and r.status["phase"] == "Pending" and r.status["jobName"] == "run-grpo"
    r = build(None, job(active=1, ready=1, startTime=NOW), None)
    assert r.next_stage is None and r.status["phase"] == "Running" and r.status["startTime"] == NOW
    r = build(r.status, job(succeeded=1), None)
    assert r.next_stage == "eval" and r.status["phase"] == "Pending" and r.status["stage"] == "eval"
    r = build(r.status, job(succeeded=1), job(succeeded=1, completionTime=LATER))
    assert r.next_stage is None and r.status["phase"] == "Succeeded"
    assert r.status["completionTime"] == LATER
    assert cond(r.status, "Complete")["status"] == "True"
    assert r.status["observedGeneration"] == 3 and r.status["runName"] == "run" and r.status["specHash"] == "abc"


def test_failure_stops_the_pipeline_and_names_the_reason() -> None:
    failed = job(conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit"}])
    r = build(None, failed, None)
    assert r.status["phase"] == "Failed" and r.next_stage is None
    assert "BackoffLimitExceeded" in r.status["message"] and "grpo" in r.status["message"]
    assert cond(r.status, "Failed")["status"] == "True" and cond(r.status, "Running")["status"] == "False"


def test_transition_time_changes_only_on_flips() -> None:
    r1 = build(None, job(active=1, ready=1), None, now=NOW)
    r2 = build(r1.status, job(active=1, ready=1), None, now=LATER)
    assert cond(r2.status, "Running")["lastTransitionTime"] == NOW
    r3 = build(r2.status, job(succeeded=1), None, now=LATER)
    assert cond(r3.status, "Running")["lastTransitionTime"] == LATER


def test_mlflow_and_checkpoint_annotations_latest_stage_wins() -> None:
    grpo = job(succeeded=1, annotations={"longhaul.dev/mlflow-run-id": "r1", "longhaul.dev/checkpoint-step": "300",
                                        "longhaul.dev/mlflow-url": "http://m/r1"})
    ev = job(active=1, ready=1, annotations={"longhaul.dev/mlflow-run-id": "r2"})
    st = build(None, grpo, ev).status
    assert st["mlflowRunId"] == "r2" and st["mlflowUrl"] == "http://m/r1" and st["lastCheckpointStep"] == 300


def test_invalid_and_refused_status() -> None:
    inv = S.invalid_status(None, "spec.x: bad", generation=2, now=NOW)
    assert inv["phase"] == "Invalid" and inv["message"] == "spec.x: bad" and inv["observedGeneration"] == 2
    assert cond(inv, "Valid") == {"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": "spec.x: bad",
                                  "lastTransitionTime": NOW, "observedGeneration": 2}
    running = build(None, job(active=1, ready=1), None).status
    refused = S.refused_status(running, "exp-12345678", generation=4, now=LATER)
    c = cond(refused, "SpecChangeRefused")
    assert c["status"] == "True" and "exp-12345678" in c["message"] and "run run is Running" in c["message"]
    assert refused["phase"] == "Running" and refused["observedGeneration"] == 4
    cleared = S.clear_refusal(refused, now=LATER, generation=5)
    assert cond(cleared, "SpecChangeRefused")["status"] == "False"
