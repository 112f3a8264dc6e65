"""Multi-node workloads against the real CRDs (KubeRay RayJob, JobSet) and Kueue queueing: rendering and the pure
status mapping. The CRDs are the projects' published files, vendored unmodified under tests/fixtures/crds/ (see
PROVENANCE.md there); the controllers' status fields written here are those of KubeRay v1.7.0, JobSet v0.12.0 and
Kueue v0.19.2 (their Go API types, named in each case)."""

from __future__ import annotations

import copy
import functools
import hashlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from longhaul import constants as C
from longhaul.k8s import status as S
from longhaul.render import kubernetes as R
from longhaul.spec import load_spec
from longhaul.spec.models import Experiment

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "tests/fixtures/crds"
sys.path.insert(0, str(ROOT / "tests/support"))
from kube_emulator import schema as crd_schema  # noqa: E402  (kube-apiserver's prune → default → validate)

NOW = "2026-01-01T00:00:00Z"


@functools.cache
def crd_version_schema(path: str, version: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are up to 1.4 MB of YAML
    crd = yaml.load((CRDS / path).read_text(), Loader=loader)
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return ver["schema"]["openAPIV3Schema"]


WORKLOAD_CRDS = {
    ("ray.io/v1", "RayJob"): "kuberay-v1.7.0/ray.io_rayjobs.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset-v0.12.0/jobset.x-k8s.io_jobsets.yaml",
}


def admit(obj: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """What kube-apiserver does to a custom object: (fields it would prune, schema violations)."""
    path = WORKLOAD_CRDS[(obj["apiVersion"], obj["kind"])]
    schema = crd_version_schema(path, obj["apiVersion"].split("/")[1])
    obj = copy.deepcopy(obj)
    pruned = crd_schema.prune(obj, schema)
    crd_schema.default(obj, schema)
    return pruned, crd_schema.validate(obj, schema)


def spec(engine: str = "rayjob", nodes: int = 2, **kubernetes: Any) -> Experiment:
    doc = load_spec(ROOT / "specs/prm_lite_lata.yaml").model_dump(mode="json")
    doc["spec"]["resources"]["nodes"] = nodes
    doc["spec"]["backends"]["kubernetes"].update(multinode_engine=engine, **kubernetes)
    return Experiment.model_validate(doc)


def test_vendored_crds_match_their_provenance() -> None:
    text = (CRDS / "PROVENANCE.md").read_text()
    files = sorted(p for p in CRDS.rglob("*.yaml"))
    assert len(files) == 10  # KubeRay, JobSet, Kueue (5), Argo CD, Flux (2)
    for p in files:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        assert re.search(rf"`{re.escape(p.relative_to(CRDS).as_posix())}`.*{digest}", text), p


@pytest.mark.parametrize("engine", ["rayjob", "jobset"])
@pytest.mark.parametrize("kueue", [{}, {"queue": "team-a", "priority_class": "high"}], ids=["plain", "kueue"])
def test_multinode_workloads_pass_the_real_crd_schemas(engine: str, kueue: dict[str, str]) -> None:
    for stage in ("grpo", "eval"):
        obj = R.render_stage(spec(engine, nodes=2, **kueue), stage, namespace="ns1")
        pruned, problems = admit(obj)
        assert pruned == [] and problems == [], (pruned, problems)


def test_the_schema_check_catches_a_mistake() -> None:
    obj = R.render_stage(spec("rayjob"), "grpo", namespace="ns1")
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "one"
    obj["spec"]["submisionMode"] = "K8sJobMode"
    pruned, problems = admit(obj)
    assert pruned == ["spec.submisionMode"]
    assert [f for f, _ in problems] == ["spec.rayClusterSpec.workerGroupSpecs[0].replicas"]


@pytest.mark.parametrize("engine", ["rayjob", "jobset"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_a_queue_creates_each_stage_suspended_with_kueue_labels(engine: str, nodes: int) -> None:
    exp = spec(engine, nodes=nodes, queue="team-a", priority_class="high")
    obj = R.render_stage(exp, "grpo", namespace="ns1")
    assert obj["kind"] == ("Job" if nodes == 1 else {"rayjob": "RayJob", "jobset": "JobSet"}[engine])
    assert obj["spec"]["suspend"] is True
    labels = obj["metadata"]["labels"]
    assert labels[C.LABEL_KUEUE_QUEUE] == "team-a" and labels[C.LABEL_KUEUE_PRIORITY_CLASS] == "high"
    # The name is a WorkloadPriorityClass here: no pod PriorityClass (only Kueue preempts), no labels on pods.
    text = yaml.safe_dump(obj)
    assert "priorityClassName" not in text and text.count(C.LABEL_KUEUE_QUEUE) == 1


def test_without_a_queue_nothing_is_suspended_and_priority_class_is_the_pods() -> None:
    obj = R.render_stage(spec(nodes=1, priority_class="high"), "grpo")
    assert "suspend" not in obj["spec"]
    assert not any(k.startswith(C.KUEUE_GROUP) for k in obj["metadata"]["labels"])
    assert obj["spec"]["template"]["spec"]["priorityClassName"] == "high"
    assert R.kueue_labels(spec(nodes=1, queue="q")) == {C.LABEL_KUEUE_QUEUE: "q"}


# ---- the controllers' status fields -> phase ----


def rayjob(suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {"kind": "RayJob", "spec": {"suspend": suspend}, "status": status}


def jobset(suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {"kind": "JobSet", "spec": {"suspend": suspend}, "status": status}


def job(suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {"kind": "Job", "spec": {"suspend": suspend, "completions": 1, "backoffLimit": 0}, "status": status}


def true(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": NOW}


@pytest.mark.parametrize(
    ("obj", "phase"),
    [
        # KubeRay: created suspended (New -> Suspended), admitted (New -> Initializing -> Running), preempted
        # (Suspending -> Suspended, jobStatus reset to ""), ValidationFailed / Failed / Complete.
        (rayjob(True), S.Phase.QUEUED),
        (rayjob(True, jobDeploymentStatus="Suspended"), S.Phase.QUEUED),
        (rayjob(True, jobDeploymentStatus="Suspending", jobStatus="RUNNING"), S.Phase.QUEUED),
        (rayjob(False, jobDeploymentStatus="Initializing"), S.Phase.PENDING),
        (rayjob(False, jobDeploymentStatus="Running", jobStatus="PENDING"), S.Phase.RUNNING),
        (rayjob(False, jobDeploymentStatus="ValidationFailed", reason="ValidationFailed"), S.Phase.FAILED),
        (rayjob(False, jobDeploymentStatus="Failed", jobStatus="FAILED", reason="AppFailed"), S.Phase.FAILED),
        (rayjob(True, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED"), S.Phase.SUCCEEDED),
        # JobSet: spec.suspend with the Suspended condition; running replicated jobs; Completed / Failed.
        (jobset(True, conditions=[true("Suspended", "SuspendedJobs", "jobset is suspended")]), S.Phase.QUEUED),
        (
            jobset(
                False,
                replicatedJobsStatus=[
                    {"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}
                ],
            ),
            S.Phase.RUNNING,
        ),
        (
            jobset(False, conditions=[true("Failed", "FailedJobs", "jobset failed due to one or more job failures")]),
            S.Phase.FAILED,
        ),
        (
            jobset(False, conditions=[true("Completed", "AllJobsCompleted", "jobset completed successfully")]),
            S.Phase.SUCCEEDED,
        ),
        # batch/v1 Job suspended by Kueue (the Job controller writes Suspended=True and removes the pods).
        (job(True, conditions=[true("Suspended", "JobSuspended", "Job suspended")]), S.Phase.QUEUED),
        (job(True, succeeded=1), S.Phase.SUCCEEDED),
    ],
)
def test_controller_status_to_phase(obj: dict[str, Any], phase: S.Phase) -> None:
    assert S.workload_phase(obj) == phase


def test_failure_messages_name_the_controllers_reason() -> None:
    assert (
        S.workload_message(rayjob(jobDeploymentStatus="Failed", reason="AppFailed", message="exit 1"))
        == "AppFailed: exit 1"
    )
    assert (
        S.workload_message(jobset(conditions=[true("Failed", "FailedJobs", "one job failed")]))
        == "FailedJobs: one job failed"
    )


def workload(*conditions: dict[str, Any], active: bool | None = None) -> dict[str, Any]:
    """A Kueue v1beta2 Workload (apis/kueue/v1beta2/workload_types.go) with these status conditions."""
    spec: dict[str, Any] = {"queueName": "team-a"}
    if active is not None:
        spec["active"] = active
    return {
        "kind": "Workload",
        "metadata": {"name": "rayjob-run-grpo-1a2b3"},
        "spec": spec,
        "status": {"conditions": list(conditions)},
    }


def false(kind: str, reason: str, message: str) -> dict[str, Any]:
    return {**true(kind, reason, message), "status": "False"}


def test_kueue_admission_says_why_a_workload_waits() -> None:
    waiting = S.kueue_admission(workload(false("QuotaReserved", "Pending", "couldn't assign flavors")), "team-a")
    assert not waiting.inadmissible and waiting.reason == "WaitingForAdmission"
    assert "LocalQueue team-a: couldn't assign flavors" in waiting.message
    assert S.kueue_admission(None, "team-a").message == "waiting for Kueue to admit it in LocalQueue team-a"

    rejected = S.kueue_admission(
        workload(false("QuotaReserved", "Inadmissible", "LocalQueue team-a doesn't exist")), "team-a"
    )
    assert rejected.inadmissible and rejected.reason == "Inadmissible"
    assert rejected.message == (
        "Kueue cannot admit workload rayjob-run-grpo-1a2b3 in LocalQueue team-a: "
        "Inadmissible: LocalQueue team-a doesn't exist"
    )

    preempted = S.kueue_admission(
        workload(
            true("Evicted", "Preempted", "Preempted to accommodate a workload (UID: u1) due to prioritization"),
            true("Preempted", "InClusterQueue", "Preempted to accommodate a workload (UID: u1)"),
            false("QuotaReserved", "Pending", "Preempted"),
        ),
        "team-a",
    )
    assert preempted.reason == "Preempted" and "InClusterQueue" in preempted.message
    assert "resumes from its last checkpoint" in preempted.message

    gone = S.kueue_admission(workload(true("Evicted", "Deactivated", "exceeded the requeue limit"), active=False), "q")
    assert gone.inadmissible and gone.reason == "Deactivated" and "exceeded the requeue limit" in gone.message


def test_queued_status_keeps_the_run_id_and_reports_kueue() -> None:
    ann = {"metadata": {"annotations": {C.ANNOTATION_MLFLOW_RUN_ID: "m1", C.ANNOTATION_CHECKPOINT_STEP: "40"}}}
    running = S.build_status(
        None,
        [S.StageView("grpo", "run-grpo", {**rayjob(jobDeploymentStatus="Running", jobStatus="RUNNING"), **ann})],
        run_name="run",
        spec_hash="h",
        generation=1,
        now=NOW,
    )
    assert running.status["phase"] == "Running" and running.status["mlflowRunId"] == "m1"
    assert not any(c["type"] == S.COND_QUEUED for c in running.status["conditions"])

    adm = S.kueue_admission(workload(true("Evicted", "Preempted", "p"), true("Preempted", "InCohort", "p")), "q")
    queued = S.build_status(
        running.status,
        [S.StageView("grpo", "run-grpo", rayjob(True, jobDeploymentStatus="Suspended"), admission=adm)],
        run_name="run",
        spec_hash="h",
        generation=1,
        now=NOW,
    )
    st = queued.status
    assert st["phase"] == "Queued" and queued.next_stage is None
    assert st["mlflowRunId"] == "m1" and st["lastCheckpointStep"] == 40  # the workload no longer reports them
    assert st["message"].startswith("stage grpo is queued (job run-grpo): preempted by Kueue (InCohort: p)")
    cond = next(c for c in st["conditions"] if c["type"] == S.COND_QUEUED)
    assert (cond["status"], cond["reason"]) == ("True", "Preempted")

    again = S.build_status(
        st,
        [S.StageView("grpo", "run-grpo", rayjob(jobDeploymentStatus="Running"))],
        run_name="run",
        spec_hash="h",
        generation=1,
        now=NOW,
    ).status
    cond = next(c for c in again["conditions"] if c["type"] == S.COND_QUEUED)
    assert again["phase"] == "Running" and (cond["status"], cond["reason"]) == ("False", "Admitted")


def test_a_group_is_queued_while_no_seed_runs() -> None:
    assert S.group_phase(["Queued", "Pending"]) == S.Phase.QUEUED
    assert S.group_phase(["Queued", "Running"]) == S.Phase.RUNNING
    assert S.group_phase(["Queued", "Succeeded"]) == S.Phase.QUEUED


@pytest.mark.asyncio
async def test_reconcile_reads_kueues_workload_only_while_queued_and_survives_a_403() -> None:
    from longhaul.k8s import reconcile as RC
    from longhaul.k8s.api import ApiError

    exp_doc = yaml.safe_load((ROOT / "specs/prm_lite_lata.yaml").read_text())
    exp_doc["spec"].setdefault("backends", {}).setdefault("kubernetes", {})["queue"] = "team-a"
    exp_doc["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    stored: dict[str, dict[str, Any]] = {}
    lists: list[str] = []

    class Api:
        workloads: list[dict[str, Any]] | None = None  # None: the operator may not list them (403)

        async def create(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            obj = {**copy.deepcopy(obj), "metadata": {**obj["metadata"], "uid": "job-uid-1"}}
            stored.setdefault(obj["metadata"]["name"], obj)
            return copy.deepcopy(stored[obj["metadata"]["name"]]), True

        async def get(self, *a: Any) -> None:
            return None

        async def list(self, api_version: str, kind: str, namespace: str | None, selector: str) -> list[dict[str, Any]]:
            lists.append(f"{kind} {selector}")
            if kind == "Workload":
                if self.workloads is None:
                    raise ApiError(403, "Forbidden", "workloads.kueue.x-k8s.io is forbidden")
                return self.workloads
            return [copy.deepcopy(o) for o in stored.values() if o["kind"] == kind]

        async def patch_status(self, *a: Any) -> dict[str, Any]:
            return {}

    api = Api()
    st = await RC.reconcile_experiment(api, exp_doc, now=NOW, emit=lambda *e: None)
    assert st["phase"] == "Queued" and "waiting for Kueue to admit it in LocalQueue team-a" in st["message"]
    st = await RC.reconcile_experiment(api, {**exp_doc, "status": st}, now=NOW, emit=lambda *e: None)
    assert f"Workload {C.LABEL_KUEUE_JOB_UID}=job-uid-1" in lists  # answered 403: the generic message
    assert st["phase"] == "Queued" and "waiting for Kueue to admit it in LocalQueue team-a" in st["message"]
    api.workloads = [workload(false("QuotaReserved", "Inadmissible", "LocalQueue team-a doesn't exist"))]
    st = await RC.reconcile_experiment(api, {**exp_doc, "status": st}, now=NOW, emit=lambda *e: None)
    assert "Inadmissible: LocalQueue team-a doesn't exist" in st["message"]
    lists.clear()
    (grpo,) = [o for o in stored.values() if o["kind"] == "Job"]
    grpo["spec"]["suspend"] = False  # admitted
    grpo["status"] = {"ready": 1, "active": 1}
    st = await RC.reconcile_experiment(api, {**exp_doc, "status": st}, now=NOW, emit=lambda *e: None)
    assert st["phase"] == "Running" and not any(x.startswith("Workload") for x in lists)


def test_a_suspended_workload_without_a_queue_says_so() -> None:
    st = S.build_status(
        None, [S.StageView("grpo", "run-grpo", job(True))], run_name="run", spec_hash="h", generation=1, now=NOW
    ).status
    assert st["phase"] == "Queued" and "spec.suspend: true" in st["message"]
