"""The apply sequences a GitOps controller sends (Argo CD, Flux) against the operator: server-side apply with the
controller's field manager, its own annotations and labels (which must not change the spec hash), a spec change
from git once the run has finished (a new run under the new hash), `longhaul history NAME`, and prune (deleting
the Experiment; nothing of the operator acts on deletion, so MLflow runs stay).

Like test_operator_e2e.py, nothing here imports the emulator or the operator; the tests play the Job controller.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import yaml
from k8s_harness import ROOT, Cluster, Operator, job_running, job_succeeded, wait_until

from longhaul.spec import build_experiment
from longhaul.spec.naming import run_name, spec_hash

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

SPEC = ROOT / "specs/prm_lite_lata.yaml"
EXP = "prm-lite-lata"
COMMIT_1, COMMIT_2, COMMIT_3 = "1" * 40, "2" * 40, "3" * 40


def gitops_doc(
    ns: str, *, commit: str, labels: dict[str, str], annotations: dict[str, str], **spec_changes: Any
) -> dict[str, Any]:
    """The spec file as the controller applies it: its tracking metadata added, the namespace set."""
    doc = yaml.safe_load(SPEC.read_text())
    doc["metadata"].update(namespace=ns, labels=labels, annotations={**annotations, "longhaul.dev/git-commit": commit})
    doc["spec"]["algorithm"].update(spec_changes)
    return doc


def argocd(ns: str, commit: str, **spec_changes: Any) -> dict[str, Any]:
    return gitops_doc(
        ns,
        commit=commit,
        labels={"app.kubernetes.io/instance": "longhaul-experiments"},
        annotations={"argocd.argoproj.io/tracking-id": f"longhaul-experiments:longhaul.dev/Experiment:{ns}/{EXP}"},
        **spec_changes,
    )


def flux(ns: str, commit: str) -> dict[str, Any]:
    return gitops_doc(
        ns,
        commit=commit,
        annotations={},
        labels={
            "kustomize.toolkit.fluxcd.io/name": "longhaul-experiments",
            "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
        },
    )


def server_side_apply(cluster: Cluster, doc: dict[str, Any], manager: str) -> None:
    cluster.kubectl("apply", "--server-side", f"--field-manager={manager}", "-f", "-", input=yaml.safe_dump(doc))


def experiment(cluster: Cluster, ns: str) -> dict[str, Any]:
    return cluster.get_json("experiment", EXP, "-n", ns)


def status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return experiment(cluster, ns).get("status") or {}


def expected_run(doc: dict[str, Any]) -> tuple[str, str]:
    exp = build_experiment(doc, file="gitops")
    return run_name(exp), spec_hash(exp)


def longhaul(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env, "LONGHAUL_KUBECTL": cluster.kubectl_bin}
    return subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_gitops_apply_sequences_history_and_prune(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    first = argocd(ns, COMMIT_1)
    server_side_apply(cluster, first, "argocd-controller")
    run, full_hash = expected_run(first)
    assert run == expected_run(yaml.safe_load(SPEC.read_text()))[0]  # the controller's metadata is not in the hash
    wait_until("the run in the status", lambda: status(cluster, ns).get("runName") == run)
    wait_until(
        "the grpo Job", lambda: cluster.kubectl("get", "job", f"{run}-grpo", "-n", ns, check=False).returncode == 0
    )

    # The same spec re-synced by Flux (its labels, a newer commit stamped): no new run, no new Job, no spec edit.
    server_side_apply(cluster, flux(ns, COMMIT_2), "kustomize-controller")
    exp = experiment(cluster, ns)
    # The generation may move (the file's `tool_output_limit: null` is dropped by the second apply's merge, as SSA
    # drops nulls): the operator re-reads the spec, finds the same hash and keeps the run, with nothing refused.
    gen = exp["metadata"]["generation"]
    st = wait_until("the re-sync handled", lambda: (s := status(cluster, ns)).get("observedGeneration") == gen and s)
    assert st["runName"] == run
    assert not any(c["type"] == "SpecChangeRefused" and c["status"] == "True" for c in st["conditions"])
    assert exp["metadata"]["labels"]["kustomize.toolkit.fluxcd.io/name"] == "longhaul-experiments"
    # The launcher reports its MLflow run on the Job; the Job event makes the operator reconcile the re-labelled body.
    cluster.kubectl("annotate", "job", f"{run}-grpo", "-n", ns, "longhaul.dev/mlflow-run-id=mlflowrun1")
    job_running(cluster, ns, f"{run}-grpo")
    st = wait_until(
        "Running with the MLflow run",
        lambda: (s := status(cluster, ns)).get("phase") == "Running" and s.get("mlflowRunId") == "mlflowrun1" and s,
    )
    assert st["runName"] == run and st["specHash"] == full_hash
    assert st["history"] == [
        {
            "runName": run,
            "specHash": full_hash,
            "gitCommit": COMMIT_1,
            "phase": "Running",
            "mlflowRunId": "mlflowrun1",
            "startTime": "2026-01-01T00:00:00Z",
        }
    ]
    assert [j["metadata"]["name"] for j in cluster.get_json("jobs", "-n", ns)["items"]] == [f"{run}-grpo"]

    job_succeeded(cluster, ns, f"{run}-grpo")
    wait_until(
        "the eval Job", lambda: cluster.kubectl("get", "job", f"{run}-eval", "-n", ns, check=False).returncode == 0
    )
    job_succeeded(cluster, ns, f"{run}-eval")
    wait_until("Succeeded", lambda: status(cluster, ns).get("phase") == "Succeeded")

    # A spec change merged in git, synced by Argo CD: a new run under the new hash, recorded after the first.
    changed = argocd(ns, COMMIT_3, total_steps=400)
    run2, hash2 = expected_run(changed)
    assert run2 != run
    server_side_apply(cluster, changed, "argocd-controller")
    wait_until(
        "the new run's Job",
        lambda: cluster.kubectl("get", "job", f"{run2}-grpo", "-n", ns, check=False).returncode == 0,
    )
    hist = wait_until("two runs in the history", lambda: len(h := status(cluster, ns).get("history") or []) == 2 and h)
    assert [(h["runName"], h["specHash"], h["gitCommit"], h["phase"]) for h in hist] == [
        (run, full_hash, COMMIT_1, "Succeeded"),
        (run2, hash2, COMMIT_3, "Pending"),
    ]
    assert hist[0]["mlflowRunId"] == "mlflowrun1" and "mlflowRunId" not in hist[1]

    # `longhaul history NAME`: the same, from the cluster (explicit namespace and kubeconfig).
    shown = longhaul(cluster, "history", EXP, "--namespace", ns, "--kubeconfig", str(cluster.kubeconfig))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:4] == ["RUN", "SPEC", "HASH", "GIT"]
    assert lines[1].split()[:5] == [run, full_hash[:12], COMMIT_1[:12], "Succeeded", "mlflowrun1"]
    assert lines[2].split()[:4] == [run2, hash2[:12], COMMIT_3[:12], "Pending"]
    as_json = longhaul(cluster, "history", EXP, "-n", ns, "--kubeconfig", str(cluster.kubeconfig), "--json")
    assert json.loads(as_json.stdout) == status(cluster, ns)["history"]
    missing = longhaul(cluster, "history", "no-such-experiment", "-n", ns, "--kubeconfig", str(cluster.kubeconfig))
    assert missing.returncode == 1 and "no-such-experiment" in missing.stderr

    # Prune (the spec file removed from git): the controller deletes the Experiment. The operator has no delete
    # handler (its only finalizer is kopf's own, for the re-sync timer, released at once) and its code cannot reach
    # MLflow (the import-linter contract on longhaul.k8s), so the runs' MLflow history stays; the children go.
    assert set(experiment(cluster, ns)["metadata"].get("finalizers") or []) <= {"kopf.zalando.org/KopfFinalizerMarker"}
    cluster.kubectl("delete", "experiment", EXP, "-n", ns, "--wait=true", timeout=60)
    wait_until("jobs garbage-collected", lambda: cluster.get_json("jobs", "-n", ns)["items"] == [])
    assert cluster.get_json("experiments", "-n", ns)["items"] == []
