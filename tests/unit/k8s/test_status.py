"""Experiment status from stage workloads (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from longhaul.k8s import status as S

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T01:00:00Z"


def job(**status: Any) -> dict[str, Any]:
    return {
        "kind": "Job",
        "spec": {"completions": 1, "backoffLimit": 0},
        "status": status,
        "metadata": {"annotations": status.pop("annotations", {})},
    }


@pytest.mark.parametrize(
    ("obj", "phase"),
    [
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
        (
            {"kind": "RayJob", "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}},
            S.Phase.SUCCEEDED,
        ),
        ({"kind": "RayJob", "status": {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"}}, S.Phase.FAILED),
        ({"kind": "RayJob", "status": {}}, S.Phase.PENDING),
        ({"kind": "JobSet", "status": {"conditions": [{"type": "Completed", "status": "True"}]}}, S.Phase.SUCCEEDED),
        ({"kind": "JobSet", "status": {"conditions": [{"type": "Failed", "status": "True"}]}}, S.Phase.FAILED),
        ({"kind": "JobSet", "status": {"replicatedJobsStatus": [{"active": 2}]}}, S.Phase.RUNNING),
    ],
)
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
    failed = job(
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            }
        ]
    )
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
    grpo = job(
        succeeded=1,
        annotations={
            "longhaul.dev/mlflow-run-id": "r1",
            "longhaul.dev/checkpoint-step": "300",
            "longhaul.dev/mlflow-url": "http://m/r1",
        },
    )
    ev = job(active=1, ready=1, annotations={"longhaul.dev/mlflow-run-id": "r2"})
    st = build(None, grpo, ev).status
    assert st["mlflowRunId"] == "r2" and st["mlflowUrl"] == "http://m/r1" and st["lastCheckpointStep"] == 300


def test_invalid_and_refused_status() -> None:
    inv = S.invalid_status(None, "spec.x: bad", generation=2, now=NOW)
    assert inv["phase"] == "Invalid" and inv["message"] == "spec.x: bad" and inv["observedGeneration"] == 2
    assert cond(inv, "Valid") == {
        "type": "Valid",
        "status": "False",
        "reason": "InvalidSpec",
        "message": "spec.x: bad",
        "lastTransitionTime": NOW,
        "observedGeneration": 2,
    }
    running = build(None, job(active=1, ready=1), None).status
    refused = S.refused_status(running, "exp-12345678", generation=4, now=LATER)
    c = cond(refused, "SpecChangeRefused")
    assert c["status"] == "True" and "exp-12345678" in c["message"] and "run run is Running" in c["message"]
    assert refused["phase"] == "Running" and refused["observedGeneration"] == 4
    cleared = S.clear_refusal(refused, now=LATER, generation=5)
    assert cond(cleared, "SpecChangeRefused")["status"] == "False"


# ---- multi-seed Experiments: one stage chain per seed run, aggregated ----

P = S.Phase


@pytest.mark.parametrize(
    ("phases", "group"),
    [
        ([P.PENDING, P.PENDING], P.PENDING),
        ([P.RUNNING, P.PENDING], P.RUNNING),
        ([P.SUCCEEDED, P.RUNNING], P.RUNNING),
        ([P.SUCCEEDED, P.PENDING], P.PENDING),  # between stages, or not started: like a single run between stages
        ([P.FAILED, P.RUNNING], P.RUNNING),  # a failed seed does not end the group while another still runs
        ([P.FAILED, P.PENDING], P.PENDING),
        ([P.FAILED, P.SUCCEEDED], P.FAILED),
        ([P.SUCCEEDED, P.FAILED, P.SUCCEEDED], P.FAILED),
        ([P.SUCCEEDED, P.SUCCEEDED], P.SUCCEEDED),
        (["Succeeded"], P.SUCCEEDED),
    ],
)
def test_group_phase(phases: list[S.Phase], group: S.Phase) -> None:
    assert S.group_phase(phases) == group


def test_group_phase_needs_a_seed_run() -> None:
    with pytest.raises(ValueError, match="at least one seed run"):
        S.group_phase([])


def seed(n: int, *workloads: dict[str, Any] | None, prev: dict[str, Any] | None = None) -> dict[str, Any]:
    """The seedRuns entry of seed `n` whose grpo/eval workloads are `workloads`."""
    run = f"g-s{n}"
    st = S.build_status(
        prev,
        [S.StageView(stage=s, name=f"{run}-{s}", workload=w) for s, w in zip(["grpo", "eval"], workloads, strict=True)],
        run_name=run,
        spec_hash="h",
        generation=None,
        now=NOW,
    ).status
    return S.seed_run_entry(n, st)


def group(prev: dict[str, Any] | None, *entries: dict[str, Any], now: str = NOW) -> dict[str, Any]:
    return S.build_group_status(prev, list(entries), run_name="g", spec_hash="gh", generation=2, now=now)


def test_seed_run_entry_keeps_the_run_status_without_conditions() -> None:
    grpo = job(
        active=1,
        ready=1,
        startTime=NOW,
        annotations={"longhaul.dev/mlflow-run-id": "r7", "longhaul.dev/checkpoint-step": "20"},
    )
    e = seed(7, grpo, None)
    assert e == {
        "seed": 7,
        "runName": "g-s7",
        "phase": "Running",
        "stage": "grpo",
        "jobName": "g-s7-grpo",
        "message": "stage grpo is running (job g-s7-grpo)",
        "startTime": NOW,
        "lastCheckpointStep": 20,
        "mlflowRunId": "r7",
    }


def test_group_status_counts_seeds_and_follows_the_seed_in_focus() -> None:
    st = group(None, seed(7, None, None), seed(8, None, None))
    assert (st["phase"], st["seeds"], st["runName"], st["specHash"]) == ("Pending", "0/2", "g", "gh")
    assert st["jobName"] == "g-s7-grpo" and st["observedGeneration"] == 2 and "startTime" not in st
    assert [e["seed"] for e in st["seedRuns"]] == [7, 8]

    st = group(st, seed(7, job(active=1, ready=1, startTime=NOW), None), seed(8, None, None))
    assert st["phase"] == "Running" and st["seeds"] == "0/2" and st["jobName"] == "g-s7-grpo"
    assert st["startTime"] == NOW and cond(st, "Running")["status"] == "True"
    assert st["message"] == "0/2 seeds succeeded; seed 7: stage grpo is running (job g-s7-grpo)"

    done = job(succeeded=1, completionTime=LATER)
    st = group(st, seed(7, job(succeeded=1), done), seed(8, job(active=1, ready=1), None), now=LATER)
    assert (st["phase"], st["seeds"], st["stage"], st["jobName"]) == ("Running", "1/2", "grpo", "g-s8-grpo")
    assert cond(st, "Running")["lastTransitionTime"] == NOW  # no flip, no new transition time
    assert st["seedRuns"][0]["phase"] == "Succeeded" and "completionTime" not in st

    st = group(st, seed(7, job(succeeded=1), done), seed(8, job(succeeded=1), done), now=LATER)
    assert (st["phase"], st["seeds"], st["jobName"]) == ("Succeeded", "2/2", "g-s8-eval")
    assert st["message"] == "all 2 seeds succeeded: seeds 7, 8" and st["completionTime"] == LATER
    assert cond(st, "Complete") | {"lastTransitionTime": None} == {
        "type": "Complete",
        "status": "True",
        "reason": "AllSeedsSucceeded",
        "message": st["message"],
        "lastTransitionTime": None,
        "observedGeneration": 2,
    }


def test_a_failed_seed_fails_the_group_only_when_every_seed_has_finished() -> None:
    failed = job(conditions=[{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}])
    st = group(None, seed(7, failed, None), seed(8, job(active=1, ready=1), None))
    assert st["phase"] == "Running" and st["seeds"] == "0/2" and st["jobName"] == "g-s8-grpo"
    assert st["message"] == (
        "0/2 seeds succeeded; seed 7 failed: stage grpo (job g-s7-grpo) failed: DeadlineExceeded; "
        "seed 8: stage grpo is running (job g-s8-grpo)"
    )
    assert cond(st, "Failed")["status"] == "False"
    st = group(st, seed(7, failed, None), seed(8, job(succeeded=1), job(succeeded=1, completionTime=LATER)))
    assert (st["phase"], st["seeds"], st["jobName"]) == ("Failed", "1/2", "g-s7-grpo")
    assert cond(st, "Failed")["status"] == "True" and cond(st, "Failed")["reason"] == "SeedFailed"
    assert st["completionTime"] == LATER  # the last seed run to finish
    assert st["message"] == "1/2 seeds succeeded; seed 7 failed: stage grpo (job g-s7-grpo) failed: DeadlineExceeded"


def _st(run: str, phase: str, **more: Any) -> dict[str, Any]:
    return {"runName": run, "specHash": run[-8:] + "f" * 56, "phase": phase, **more}


def test_history_follows_a_run_and_appends_on_a_new_run() -> None:
    h = S.record_history(None, _st("x-aaaaaaaa", "Pending"), git_commit="c1")
    h = S.record_history(h, _st("x-aaaaaaaa", "Running", mlflowRunId="r1", startTime=NOW), git_commit="c2")
    assert h == [
        {
            "runName": "x-aaaaaaaa",
            "specHash": "aaaaaaaa" + "f" * 56,
            "phase": "Running",
            "gitCommit": "c1",
            "mlflowRunId": "r1",
            "startTime": NOW,
        }
    ]  # the commit that started the run
    h = S.record_history(h, _st("x-bbbbbbbb", "Pending"), git_commit="c3")
    h = S.record_history(h, _st("x-bbbbbbbb", "Succeeded", mlflowRunId="r2", completionTime=LATER), git_commit="c3")
    assert [(e["runName"], e["phase"], e["gitCommit"], e.get("mlflowRunId")) for e in h] == [
        ("x-aaaaaaaa", "Running", "c1", "r1"),
        ("x-bbbbbbbb", "Succeeded", "c3", "r2"),
    ]
    assert h[-1]["completionTime"] == LATER


def test_history_keeps_its_entries_on_an_invalid_status_and_a_late_commit_fills_in() -> None:
    h = S.record_history(None, _st("x-aaaaaaaa", "Running"), git_commit=None)
    assert "gitCommit" not in h[0]
    assert S.record_history(h, {"phase": "Invalid", "message": "bad"}, git_commit="c9") == h
    assert S.record_history(h, _st("x-aaaaaaaa", "Running"), git_commit="c9")[0]["gitCommit"] == "c9"


def test_history_is_bounded_newest_last() -> None:
    h: list[dict[str, Any]] = []
    for i in range(S.HISTORY_LIMIT + 7):
        h = S.record_history(h, _st(f"x-{i:08d}", "Succeeded"), git_commit=None)
    assert len(h) == S.HISTORY_LIMIT
    assert h[0]["runName"] == "x-00000007" and h[-1]["runName"] == f"x-{S.HISTORY_LIMIT + 6:08d}"


def test_supersede_history_ends_the_stopped_run_and_makes_its_entry_when_missing() -> None:
    h = S.record_history(None, _st("x-aaaaaaaa", "Running", mlflowRunId="r1", startTime=NOW), git_commit="c1")
    previous = _st("x-aaaaaaaa", "Running", mlflowRunId="r1", startTime=NOW)
    out = S.supersede_history(h, previous, now=LATER)
    assert out == [{**h[0], "phase": "Superseded", "completionTime": LATER}]
    assert S.supersede_history(h, previous, now=LATER) == out and h[0]["phase"] == "Running"  # pure, repeatable
    # A status from before the history existed: the stopped run gets its entry, without the edit's commit.
    assert S.supersede_history(None, previous, now=LATER) == [
        {
            "runName": "x-aaaaaaaa",
            "specHash": previous["specHash"],
            "phase": "Superseded",
            "mlflowRunId": "r1",
            "startTime": NOW,
            "completionTime": LATER,
        }
    ]
    assert S.Phase.SUPERSEDED in S.TERMINAL and S.Phase.SUPERSEDED not in S.ACTIVE
