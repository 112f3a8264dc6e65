"""Multi-node stages (KubeRay RayJob, JobSet) and Kueue queueing end to end: the projects' real CRDs (vendored,
tests/fixtures/crds/, PROVENANCE.md) installed into the cluster, the operator as a `kopf run` process, and the
tests playing the controllers the test API server does not run. What each controller writes is taken from its Go
API types at the vendored tag:

- Kueue v0.19.2 (apis/kueue/v1beta2): a Workload per job (label `kueue.x-k8s.io/job-uid`, owned by the job)
  whose conditions say why it waits; admission = unsuspend the job; preemption = conditions Evicted/Preempted
  and suspend the job again; rejection = `QuotaReserved` False with reason Inadmissible.
- KubeRay v1.7.0 (ray-operator/apis/ray/v1/rayjob_types.go): status.jobDeploymentStatus / jobStatus / reason.
- JobSet v0.12.0 (api/jobset/v1alpha2): conditions Suspended / Completed / Failed, replicatedJobsStatus.
- batch/v1 Job controller: Suspended condition, active/ready counts.

Every object the tests write (Kueue queues, Workloads, status updates) passes the CRDs' schemas on the way in,
like the operator's RayJobs and JobSets. Nothing here imports the emulator or the operator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_harness import ROOT, Cluster, Operator, job_running, job_status, wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CRDS = ROOT / "tests/fixtures/crds"
SPEC = ROOT / "specs/prm_lite_lata.yaml"
EXP = "prm-lite-lata"
NOW = "2026-01-01T00:00:00Z"
QUEUE_LABEL, JOB_UID_LABEL = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/job-uid"


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    """KubeRay's, JobSet's and Kueue's CRDs as published. Server-side apply: a client-side apply would store each
    (up to 1.4 MB) in a last-applied annotation, which a real API server refuses (256 KiB limit)."""
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(CRDS / "kuberay-v1.7.0"),
        "-f",
        str(CRDS / "jobset-v0.12.0"),
        "-f",
        str(CRDS / "kueue-v0.19.2"),
        timeout=180,
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/rayjobs.ray.io",
        "crd/jobsets.jobset.x-k8s.io",
        "crd/workloads.kueue.x-k8s.io",
        "crd/localqueues.kueue.x-k8s.io",
    )


@pytest.fixture
def fast_operator(cluster: Cluster, namespace: str, crds: None, tmp_path: Path) -> Iterator[Operator]:
    """The operator re-syncing every second: it follows RayJobs and JobSets by re-sync (it watches only Jobs)."""
    op = Operator(cluster, namespace, tmp_path)
    op.env["LONGHAUL_OPERATOR_RESYNC_S"] = "1"
    op.start()
    try:
        yield op
    finally:
        op.stop()


def apply_spec(cluster: Cluster, ns: str, **kubernetes: Any) -> None:
    doc = yaml.safe_load(SPEC.read_text())
    if kubernetes.pop("nodes", 1) > 1:
        doc["spec"]["resources"]["nodes"] = 2
    doc["spec"].setdefault("backends", {}).setdefault("kubernetes", {}).update(kubernetes)
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))


def status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return cluster.get_json("experiment", EXP, "-n", ns).get("status") or {}


def wait_status(cluster: Cluster, ns: str, what: str, pred: Any, timeout: float = 30) -> dict[str, Any]:
    return wait_until(what, lambda: (lambda st: st if pred(st) else None)(status(cluster, ns)), timeout=timeout)


def queued_condition(st: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == "Queued")


def patch(cluster: Cluster, ns: str, kind: str, name: str, body: dict[str, Any], *, subresource: bool = False) -> None:
    args = ["patch", kind, name, "-n", ns, "--type=merge", "-p", json.dumps(body)]
    cluster.kubectl(*args, *(["--subresource=status"] if subresource else []))


def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": NOW}


def kueue_queues(cluster: Cluster, ns: str, queue: str) -> None:
    """A ResourceFlavor, ClusterQueue, LocalQueue and WorkloadPriorityClass, as a cluster admin sets them up
    (validated against Kueue's CRDs; nothing reads them: the tests play Kueue)."""
    cq = f"cq-{ns}"
    docs = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default-flavor"}},
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "default-flavor",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": 64},
                                    {"name": "memory", "nominalQuota": "1Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": 8},
                                ],
                            }
                        ],
                    }
                ],
                "preemption": {"withinClusterQueue": "LowerPriority"},
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": ns},
            "spec": {"clusterQueue": cq},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "high"},
            "value": 1000,
            "description": "training runs",
        },
    ]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))


def kueue_workload(
    cluster: Cluster, ns: str, job: dict[str, Any], pod_sets: list[dict[str, Any]], conditions: list[dict[str, Any]]
) -> str:
    """Play Kueue's job reconciler: the Workload of one job (owned by it, labelled with its uid), then its status."""
    meta = job["metadata"]
    name = f"{job['kind'].lower()}-{meta['name']}-1a2b3"
    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {JOB_UID_LABEL: meta["uid"]},
            "ownerReferences": [
                {
                    "apiVersion": job["apiVersion"],
                    "kind": job["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"queueName": meta["labels"][QUEUE_LABEL], "podSets": pod_sets, "active": True},
    }
    if meta["labels"].get("kueue.x-k8s.io/priority-class"):
        wl["spec"]["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": meta["labels"]["kueue.x-k8s.io/priority-class"],
        }
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(wl))
    patch(cluster, ns, "workload", name, {"status": {"conditions": conditions}}, subresource=True)
    return name


def one(cluster: Cluster, ns: str, kind: str) -> dict[str, Any]:
    items = cluster.get_json(kind, "-n", ns)["items"]
    assert len(items) == 1, [i["metadata"]["name"] for i in items]
    return items[0]


def test_rayjob_queued_admitted_preempted_resumed_and_failed(
    cluster: Cluster, namespace: str, fast_operator: Operator
) -> None:
    ns = namespace
    kueue_queues(cluster, ns, "team-a")
    apply_spec(cluster, ns, nodes=2, queue="team-a", priority_class="high")
    ray = wait_until("the RayJob", lambda: cluster.get_json("rayjobs", "-n", ns)["items"])[0]
    name, uid = ray["metadata"]["name"], ray["metadata"]["uid"]
    # Created suspended, with Kueue's labels, and stored as rendered (nothing pruned by the real schema).
    assert ray["spec"]["suspend"] is True and ray["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert ray["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert ray["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1
    st = wait_status(cluster, ns, "Queued", lambda s: s.get("phase") == "Queued")
    assert "waiting for Kueue" in st["message"]

    # Kueue creates one Workload for the RayJob: head and workers are pod sets of it, admitted together.
    tpl = ray["spec"]["rayClusterSpec"]
    pod_sets = [
        {"name": "head", "count": 1, "template": tpl["headGroupSpec"]["template"]},
        {"name": "workers", "count": 1, "template": tpl["workerGroupSpecs"][0]["template"]},
    ]
    wl = kueue_workload(
        cluster,
        ns,
        ray,
        pod_sets,
        [
            cond(
                "QuotaReserved",
                "False",
                "Pending",
                "couldn't assign flavors to pod set head: insufficient unused quota for cpu",
            )
        ],
    )
    wait_status(cluster, ns, "Kueue's reason", lambda s: "insufficient unused quota" in s.get("message", ""))

    # Admission: quota reserved and admitted, the RayJob unsuspended; KubeRay brings the cluster up.
    admitted = [
        cond("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue cq-{ns}"),
        cond("Admitted", "True", "Admitted", "The workload is admitted"),
    ]
    patch(cluster, ns, "workload", wl, {"status": {"conditions": admitted}}, subresource=True)
    patch(cluster, ns, "rayjob", name, {"spec": {"suspend": False}})
    patch(
        cluster,
        ns,
        "rayjob",
        name,
        {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "startTime": NOW}},
        subresource=True,
    )
    cluster.kubectl(
        "annotate", "rayjob", name, "-n", ns, "longhaul.dev/mlflow-run-id=0123abcd", "longhaul.dev/checkpoint-step=40"
    )
    st = wait_status(cluster, ns, "Running", lambda s: s.get("phase") == "Running" and s.get("mlflowRunId"))
    assert queued_condition(st)["status"] == "False" and queued_condition(st)["reason"] == "Admitted"

    # Preemption: Kueue evicts the Workload and suspends the RayJob; KubeRay deletes the cluster (Suspended).
    patch(
        cluster,
        ns,
        "workload",
        wl,
        {
            "status": {
                "conditions": [
                    cond(
                        "Evicted",
                        "True",
                        "Preempted",
                        "Preempted to accommodate a workload (UID: u-hi) due to prioritization",
                    ),
                    cond("Preempted", "True", "InClusterQueue", "Preempted to accommodate a workload (UID: u-hi)"),
                    cond("QuotaReserved", "False", "Pending", "Preempted"),
                    cond("Admitted", "False", "NoReservation", ""),
                ]
            }
        },
        subresource=True,
    )
    patch(cluster, ns, "rayjob", name, {"spec": {"suspend": True}})
    patch(
        cluster, ns, "rayjob", name, {"status": {"jobDeploymentStatus": "Suspended", "jobStatus": ""}}, subresource=True
    )
    st = wait_status(cluster, ns, "Queued after preemption", lambda s: s.get("phase") == "Queued")
    assert "preempted by Kueue (InClusterQueue" in st["message"] and queued_condition(st)["reason"] == "Preempted"
    assert st["mlflowRunId"] == "0123abcd" and st["lastCheckpointStep"] == 40

    # Re-admitted: the same RayJob runs again (same name, uid, run directory and run name, so the launcher resumes
    # from the checkpoint into the same MLflow run); the operator made no second workload.
    patch(cluster, ns, "rayjob", name, {"spec": {"suspend": False}})
    patch(
        cluster,
        ns,
        "rayjob",
        name,
        {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}},
        subresource=True,
    )
    st = wait_status(cluster, ns, "Running again", lambda s: s.get("phase") == "Running")
    again = one(cluster, ns, "rayjobs")
    assert again["metadata"]["uid"] == uid and st["mlflowRunId"] == "0123abcd" and st["jobName"] == name
    assert again["spec"]["entrypoint"] == ray["spec"]["entrypoint"]
    assert cluster.get_json("jobs", "-n", ns)["items"] == []

    # The Ray job fails: KubeRay's reason and message reach the Experiment.
    patch(
        cluster,
        ns,
        "rayjob",
        name,
        {
            "status": {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": "Job entrypoint exited with 1",
            }
        },
        subresource=True,
    )
    st = wait_status(cluster, ns, "Failed", lambda s: s.get("phase") == "Failed")
    assert "AppFailed: Job entrypoint exited with 1" in st["message"]


def test_jobset_rejected_by_kueue_then_admitted_as_one_gang(
    cluster: Cluster, namespace: str, fast_operator: Operator
) -> None:
    ns = namespace
    apply_spec(cluster, ns, nodes=2, queue="no-such-queue", multinode_engine="jobset")
    js = wait_until("the JobSet", lambda: cluster.get_json("jobsets", "-n", ns)["items"])[0]
    name = js["metadata"]["name"]
    assert js["spec"]["suspend"] is True and js["metadata"]["labels"][QUEUE_LABEL] == "no-such-queue"
    # The JobSet controller reports the suspension.
    patch(
        cluster,
        ns,
        "jobset",
        name,
        {"status": {"restarts": 0, "conditions": [cond("Suspended", "True", "SuspendedJobs", "jobset is suspended")]}},
        subresource=True,
    )
    # Kueue: one Workload, one pod set per replicated job (both nodes in it): inadmissible, no such LocalQueue.
    rj = js["spec"]["replicatedJobs"][0]
    pod_sets = [
        {
            "name": rj["name"],
            "count": rj["template"]["spec"]["parallelism"],
            "template": rj["template"]["spec"]["template"],
        }
    ]
    assert pod_sets[0]["count"] == 2
    wl = kueue_workload(
        cluster,
        ns,
        js,
        pod_sets,
        [
            cond("QuotaReserved", "False", "Inadmissible", "LocalQueue no-such-queue doesn't exist"),
            cond("Requeued", "False", "Inadmissible", "LocalQueue no-such-queue doesn't exist"),
        ],
    )
    st = wait_status(cluster, ns, "the rejection", lambda s: "Inadmissible" in s.get("message", ""))
    assert st["phase"] == "Queued" and queued_condition(st)["reason"] == "Inadmissible"
    assert (
        f"Kueue cannot admit workload {wl} in LocalQueue no-such-queue: Inadmissible: LocalQueue "
        "no-such-queue doesn't exist"
    ) in st["message"]

    # The queue is created and Kueue admits the whole JobSet; its controller runs both pods, then completes.
    patch(cluster, ns, "jobset", name, {"spec": {"suspend": False}})
    patch(
        cluster,
        ns,
        "jobset",
        name,
        {
            "status": {
                "conditions": [cond("Suspended", "False", "ResumeJobs", "jobset is resumed")],
                "replicatedJobsStatus": [
                    {"name": "node", "ready": 1, "active": 1, "succeeded": 0, "failed": 0, "suspended": 0}
                ],
            }
        },
        subresource=True,
    )
    wait_status(cluster, ns, "Running", lambda s: s.get("phase") == "Running")
    patch(
        cluster,
        ns,
        "jobset",
        name,
        {
            "status": {
                "terminalState": "Completed",
                "conditions": [cond("Completed", "True", "AllJobsCompleted", "jobset completed successfully")],
            }
        },
        subresource=True,
    )
    # The next stage is its own workload, queued again (each stage is admitted separately).
    st = wait_status(
        cluster, ns, "the eval stage queued", lambda s: s.get("stage") == "eval" and s["phase"] == "Queued"
    )
    ev = wait_until(
        "the eval JobSet",
        lambda: [j for j in cluster.get_json("jobsets", "-n", ns)["items"] if j["metadata"]["name"] != name],
    )[0]
    assert ev["spec"]["suspend"] is True and st["jobName"] == ev["metadata"]["name"]
    patch(cluster, ns, "jobset", ev["metadata"]["name"], {"spec": {"suspend": False}})
    patch(
        cluster,
        ns,
        "jobset",
        ev["metadata"]["name"],
        {
            "status": {
                "terminalState": "Failed",
                "conditions": [cond("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures")],
            }
        },
        subresource=True,
    )
    st = wait_status(cluster, ns, "Failed", lambda s: s.get("phase") == "Failed")
    assert "FailedJobs: jobset failed due to one or more job failures" in st["message"]


def test_job_preempted_by_kueue_resumes_as_the_same_job(
    cluster: Cluster, namespace: str, fast_operator: Operator
) -> None:
    ns = namespace
    apply_spec(cluster, ns, queue="team-a")
    job = wait_until("the Job", lambda: cluster.get_json("jobs", "-n", ns)["items"])[0]
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    wait_status(cluster, ns, "Queued", lambda s: s.get("phase") == "Queued")

    patch(cluster, ns, "job", name, {"spec": {"suspend": False}})  # admitted
    job_running(cluster, ns, name)
    cluster.kubectl("annotate", "job", name, "-n", ns, "longhaul.dev/mlflow-run-id=feedbeef")
    wait_status(cluster, ns, "Running", lambda s: s.get("phase") == "Running" and s.get("mlflowRunId"))

    # Preempted: suspended again; the Job controller removes the pods and says so.
    patch(cluster, ns, "job", name, {"spec": {"suspend": True}})
    job_status(
        cluster,
        ns,
        name,
        {"active": 0, "ready": 0, "conditions": [cond("Suspended", "True", "JobSuspended", "Job suspended")]},
    )
    st = wait_status(cluster, ns, "Queued after preemption", lambda s: s.get("phase") == "Queued")
    assert st["mlflowRunId"] == "feedbeef"

    patch(cluster, ns, "job", name, {"spec": {"suspend": False}})
    job_status(
        cluster,
        ns,
        name,
        {"active": 1, "ready": 1, "conditions": [cond("Suspended", "False", "JobResumed", "Job resumed")]},
    )
    st = wait_status(cluster, ns, "Running again", lambda s: s.get("phase") == "Running")
    assert one(cluster, ns, "jobs")["metadata"]["uid"] == uid and st["mlflowRunId"] == "feedbeef"
