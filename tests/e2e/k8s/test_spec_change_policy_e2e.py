"""The spec-change policy `new-run` (annotation `longhaul.dev/on-spec-change`) as a GitOps controller drives it:
server-side applies by `argocd-controller` of the spec file with the annotation, against the real operator.

A spec edit of the running run stops it (its Job deleted) and starts the edited spec under its new run name;
`status.history` ends the old run Superseded; repeated reconciles add nothing; an invalid edit is refused while
the run goes on; switching the policy alone keeps the run; and the old spec applied again (refused under
`refuse`, then started by switching the policy to `new-run`) resumes the old run under its old name.

Like test_gitops_e2e.py, nothing here imports the emulator or the operator; the tests play the Job controller.
Not exercised (no pods here): the pods' SIGTERM and grace period, and veRL resuming from its newest checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from k8s_harness import ROOT, Cluster, Operator, job_running, wait_until

from longhaul import constants as C
from longhaul.spec import build_experiment
from longhaul.spec.naming import run_name, spec_hash

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

SPEC = ROOT / "specs/prm_lite_lata.yaml"
EXP = "prm-lite-lata"
MANAGER = "argocd-controller"
COMMIT_1, COMMIT_2, COMMIT_3 = "1" * 40, "2" * 40, "3" * 40
#: Longer than the operator's re-sync in these tests (LONGHAUL_OPERATOR_RESYNC_S=5): time for a reconcile that
#: should change nothing to have happened.
SETTLE_S = 7


def doc(ns: str, commit: str, policy: str, **algorithm: Any) -> dict[str, Any]:
    """The spec file as Argo CD applies it: tracking annotation, the git commit and the policy stamped on it."""
    d = yaml.safe_load(SPEC.read_text())
    d["metadata"].update(
        namespace=ns,
        labels={"app.kubernetes.io/instance": "longhaul-experiments"},
        annotations={
            "argocd.argoproj.io/tracking-id": f"longhaul-experiments:longhaul.dev/Experiment:{ns}/{EXP}",
            C.ANNOTATION_GIT_COMMIT: commit,
            C.ANNOTATION_ON_SPEC_CHANGE: policy,
        },
    )
    d["spec"]["algorithm"].update(algorithm)
    return d


def apply(cluster: Cluster, d: dict[str, Any]) -> int:
    """Server-side apply as Argo CD; the Experiment's generation after it."""
    cluster.kubectl("apply", "--server-side", f"--field-manager={MANAGER}", "-f", "-", input=yaml.safe_dump(d))
    return cluster.get_json("experiment", EXP, "-n", d["metadata"]["namespace"])["metadata"]["generation"]


def status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return cluster.get_json("experiment", EXP, "-n", ns).get("status") or {}


def jobs(cluster: Cluster, ns: str) -> list[str]:
    """Stage Jobs that exist and are not being deleted."""
    return sorted(
        j["metadata"]["name"]
        for j in cluster.get_json("jobs", "-n", ns)["items"]
        if not j["metadata"].get("deletionTimestamp")
    )


def refusal(st: dict[str, Any]) -> dict[str, Any] | None:
    return next(
        (c for c in st.get("conditions") or [] if c["type"] == "SpecChangeRefused" and c["status"] == "True"), None
    )


def names(d: dict[str, Any]) -> tuple[str, str]:
    exp = build_experiment(d, file="gitops")
    return run_name(exp), spec_hash(exp)


def history(st: dict[str, Any]) -> list[tuple[str, str, str | None, str]]:
    return [(h["runName"], h["specHash"], h.get("gitCommit"), h["phase"]) for h in st.get("history") or []]


def test_new_run_policy_under_gitops_applies(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    v1 = doc(ns, COMMIT_1, C.SPEC_CHANGE_NEW_RUN)
    run1, hash1 = names(v1)
    apply(cluster, v1)
    wait_until("the first run's Job", lambda: jobs(cluster, ns) == [f"{run1}-grpo"])
    cluster.kubectl(
        "annotate",
        "job",
        f"{run1}-grpo",
        "-n",
        ns,
        f"{C.ANNOTATION_MLFLOW_RUN_ID}=mlflowrun1",
        f"{C.ANNOTATION_CHECKPOINT_STEP}=40",
    )
    job_running(cluster, ns, f"{run1}-grpo")
    wait_until(
        "the first run Running",
        lambda: (s := status(cluster, ns)).get("phase") == "Running" and s.get("lastCheckpointStep") == 40,
    )

    # A spec change merged in git and synced: the running run is stopped, the edit starts under its new name.
    v2 = doc(ns, COMMIT_2, C.SPEC_CHANGE_NEW_RUN, total_steps=400)
    run2, hash2 = names(v2)
    gen = apply(cluster, v2)
    wait_until("the old run's Job deleted and the new run's created", lambda: jobs(cluster, ns) == [f"{run2}-grpo"])
    st = wait_until(
        "the new run in the status",
        lambda: (
            (s := status(cluster, ns)).get("runName") == run2
            and s.get("observedGeneration") == gen
            and len(s.get("history") or []) == 2
            and s
        ),
    )
    assert history(st) == [(run1, hash1, COMMIT_1, "Superseded"), (run2, hash2, COMMIT_2, "Pending")]
    assert st["history"][0]["mlflowRunId"] == "mlflowrun1" and st["history"][0]["completionTime"]
    assert st["phase"] == "Pending" and refusal(st) is None
    # The old run's ConfigMap (its resolved spec) stays: the operator deletes stage workloads only.
    cluster.kubectl("get", "configmap", f"{run1}-spec", "-n", ns)
    events = wait_until(
        "a RunSuperseded event",
        lambda: [e for e in cluster.get_json("events", "-n", ns)["items"] if e.get("reason") == "RunSuperseded"],
    )
    assert f"run {run2} starts" in events[0]["message"]

    # Reconciled again (a Job event, re-syncs): no duplicate Job, no further history entry.
    job_running(cluster, ns, f"{run2}-grpo")
    wait_until("the new run Running", lambda: status(cluster, ns).get("phase") == "Running")
    time.sleep(SETTLE_S)
    st = status(cluster, ns)
    assert jobs(cluster, ns) == [f"{run2}-grpo"]
    assert history(st) == [(run1, hash1, COMMIT_1, "Superseded"), (run2, hash2, COMMIT_2, "Running")]

    # An invalid spec from git under new-run: refused, the run goes on.
    bad = doc(ns, COMMIT_3, C.SPEC_CHANGE_NEW_RUN, total_steps=400)
    bad["spec"]["evaluation"]["k"] = [1, 16]
    gen = apply(cluster, bad)
    st = wait_until(
        "the invalid edit refused",
        lambda: (r := refusal(s := status(cluster, ns))) is not None and r.get("observedGeneration") == gen and s,
    )
    assert "also invalid" in refusal(st)["message"] and st["runName"] == run2 and st["phase"] == "Running"
    assert jobs(cluster, ns) == [f"{run2}-grpo"] and len(st["history"]) == 2

    # The running spec again, then the policy alone switched to refuse: the same run throughout.
    gen = apply(cluster, v2)
    wait_until(
        "the refusal cleared",
        lambda: (s := status(cluster, ns)).get("observedGeneration") == gen and refusal(s) is None,
    )
    apply(cluster, doc(ns, COMMIT_2, C.SPEC_CHANGE_REFUSE, total_steps=400))
    time.sleep(SETTLE_S)
    st = status(cluster, ns)
    assert st["runName"] == run2 and refusal(st) is None and jobs(cluster, ns) == [f"{run2}-grpo"]
    assert len(st["history"]) == 2

    # The first spec reverted in git under refuse: refused. Then only the policy switched to new-run (an
    # annotation edit): the refused edit starts, which resumes the first run under its old name.
    gen = apply(cluster, doc(ns, COMMIT_1, C.SPEC_CHANGE_REFUSE))
    wait_until(
        "the revert refused",
        lambda: (r := refusal(status(cluster, ns))) is not None and r.get("observedGeneration") == gen,
    )
    assert jobs(cluster, ns) == [f"{run2}-grpo"]
    apply(cluster, doc(ns, COMMIT_1, C.SPEC_CHANGE_NEW_RUN))
    wait_until("the first run resumed", lambda: jobs(cluster, ns) == [f"{run1}-grpo"])
    st = wait_until(
        "three runs in the history", lambda: len((s := status(cluster, ns)).get("history") or []) == 3 and s
    )
    assert history(st) == [
        (run1, hash1, COMMIT_1, "Superseded"),
        (run2, hash2, COMMIT_2, "Superseded"),
        (run1, hash1, COMMIT_1, "Pending"),
    ]
    assert st["runName"] == run1 and refusal(st) is None
    # The policy annotation's own update handler ran (a metadata edit does not reach the `spec` handler).
    assert "spec_change_policy" in operator.logs()
