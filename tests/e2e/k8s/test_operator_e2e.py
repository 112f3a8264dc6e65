"""`kubectl apply -f specs/prm_lite_lata.yaml` end to end: the CRD from the chart, the operator as a `kopf run`
process, the Job and ConfigMap it creates, simulated Job progress, phases, deletion cascade, invalid specs,
an operator killed mid-reconcile, and a refused edit of a running spec.

Nothing here imports the emulator or the operator: see conftest.py for running it against a real cluster.
The tests play the Job controller by patching Job status (nothing runs pods on the test API server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_harness import ROOT, Cluster, Operator, job_failed, job_running, job_succeeded, wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

SPEC = ROOT / "specs/prm_lite_lata.yaml"
EXP = "prm-lite-lata"


def spec_doc(**spec_changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load(SPEC.read_text())
    for dotted, value in spec_changes.items():
        cur = doc["spec"]
        *parents, last = dotted.split("__")
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[last] = value
    return doc


def apply(cluster: Cluster, ns: str, doc: dict[str, Any] | None = None, *, check: bool = True):
    if doc is None:
        return cluster.kubectl("apply", "-n", ns, "-f", str(SPEC), check=check)
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def experiment(cluster: Cluster, ns: str, name: str = EXP) -> dict[str, Any]:
    return cluster.get_json("experiment", name, "-n", ns)


def run_jobs(cluster: Cluster, ns: str, run: str) -> list[dict[str, Any]]:
    return cluster.get_json("jobs", "-n", ns, "-l", f"longhaul.dev/run-name={run}")["items"]


def wait_phase(cluster: Cluster, ns: str, phase: str, name: str = EXP, timeout: int = 60) -> None:
    cluster.kubectl(
        "wait",
        f"experiment/{name}",
        "-n",
        ns,
        f"--for=jsonpath={{.status.phase}}={phase}",
        f"--timeout={timeout}s",
        timeout=timeout + 10,
    )


def wait_for_run(cluster: Cluster, ns: str, name: str = EXP) -> str:
    return wait_until("status.runName", lambda: (experiment(cluster, ns, name).get("status") or {}).get("runName"))


def condition(exp: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (exp.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def test_apply_prm_lite_lata_runs_stages_and_cascades_on_delete(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    ns = namespace
    out = apply(cluster, ns)
    assert "experiment.longhaul.dev/prm-lite-lata created" in out.stdout

    run = wait_for_run(cluster, ns)
    assert run.startswith("prm-lite-lata-") and len(run) == len("prm-lite-lata-") + 8
    cm = wait_until(
        "the spec ConfigMap",
        lambda: cluster.kubectl("get", "configmap", f"{run}-spec", "-n", ns, "-o", "json", check=False).stdout,
    )
    grpo = wait_until(
        "the grpo Job", lambda: cluster.kubectl("get", "job", f"{run}-grpo", "-n", ns, "-o", "json", check=False).stdout
    )
    cm, grpo = json.loads(cm), json.loads(grpo)
    exp = experiment(cluster, ns)
    uid = exp["metadata"]["uid"]

    # Children: owned by the Experiment (cascade), labelled, the resolved spec mounted and re-validatable.
    for child in (cm, grpo):
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("Experiment", EXP, uid, True)
        assert child["metadata"]["labels"]["longhaul.dev/run-name"] == run
    resolved = yaml.safe_load(cm["data"]["experiment.yaml"])
    assert resolved["metadata"]["name"] == EXP
    assert resolved["spec"]["algorithm"]["advantage"] == "lata"
    assert resolved["spec"]["algorithm"]["clip_ratio"] == 0.2  # a default, filled in
    pod = grpo["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:2] == ["longhaul", "launch"]
    assert container["command"][-2:] == ["--stage", "grpo"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"] == {"name": "mlflow", "key": "tracking-uri"}
    assert env["LONGHAUL_RUN_NAME"]["value"] == run
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert grpo["spec"]["activeDeadlineSeconds"] == 3 * 24 * 3600
    # Stages run one after the other: no eval Job before grpo finished.
    assert [j["metadata"]["name"] for j in run_jobs(cluster, ns, run)] == [f"{run}-grpo"]
    assert experiment(cluster, ns)["status"]["phase"] == "Pending"

    job_running(cluster, ns, f"{run}-grpo")
    wait_phase(cluster, ns, "Running")
    cluster.kubectl(
        "annotate",
        "job",
        f"{run}-grpo",
        "-n",
        ns,
        "longhaul.dev/mlflow-run-id=0123abcd",
        "longhaul.dev/mlflow-url=http://mlflow.example/#/runs/0123abcd",
        "longhaul.dev/checkpoint-step=50",
    )
    status = wait_until(
        "MLflow run id in the status", lambda: (s := experiment(cluster, ns)["status"]).get("mlflowRunId") and s
    )
    assert status["mlflowUrl"] == "http://mlflow.example/#/runs/0123abcd"
    assert status["lastCheckpointStep"] == 50
    assert status["stage"] == "grpo" and status["startTime"]
    assert status["observedGeneration"] == exp["metadata"]["generation"]
    printed = cluster.kubectl("get", "experiment", EXP, "-n", ns).stdout
    assert "Running" in printed and run in printed  # printer columns

    job_succeeded(cluster, ns, f"{run}-grpo")
    eval_job = wait_until(
        "the eval Job", lambda: cluster.kubectl("get", "job", f"{run}-eval", "-n", ns, "-o", "json", check=False).stdout
    )
    assert json.loads(eval_job)["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "eval"
    job_running(cluster, ns, f"{run}-eval")
    job_succeeded(cluster, ns, f"{run}-eval")
    wait_phase(cluster, ns, "Succeeded")
    final = experiment(cluster, ns)
    assert condition(final, "Complete")["status"] == "True"
    assert condition(final, "Running")["status"] == "False"
    assert final["status"]["completionTime"]
    assert len(run_jobs(cluster, ns, run)) == 2

    cluster.kubectl("delete", "experiment", EXP, "-n", ns, "--timeout=60s")
    wait_until("the cascade to delete the Jobs", lambda: run_jobs(cluster, ns, run) == [])
    wait_until(
        "the cascade to delete the ConfigMap",
        lambda: cluster.kubectl("get", "configmap", f"{run}-spec", "-n", ns, check=False).returncode != 0,
    )
    # The operator forgets a deleted Experiment (no per-name state grows with every spec a GitOps repo prunes).
    wait_until(
        "the operator to forget the deleted Experiment", lambda: operator.probes().get("experiments_tracked") == 0
    )


def test_invalid_spec_ends_invalid_without_children(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    # Valid for the CRD schema (the API server accepts it) but not for the model: max k exceeds the trials.
    doc = spec_doc(evaluation__k=[1, 2, 16])
    doc["metadata"]["name"] = "bad-k"
    apply(cluster, ns, doc)
    wait_phase(cluster, ns, "Invalid", name="bad-k")
    exp = experiment(cluster, ns, "bad-k")
    assert "evaluation.samples_per_task" in exp["status"]["message"]
    assert "must be ≥ max k (16)" in exp["status"]["message"]
    valid = condition(exp, "Valid")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert cluster.get_json("jobs", "-n", ns)["items"] == []
    assert cluster.get_json("configmaps", "-n", ns, "-l", "longhaul.dev/experiment=bad-k")["items"] == []
    events = wait_until(
        "an InvalidSpec event",
        lambda: [
            e
            for e in cluster.get_json("events", "-n", ns)["items"]
            if e.get("reason") == "InvalidSpec" and e["involvedObject"]["name"] == "bad-k"
        ],
    )
    assert "samples_per_task" in events[0]["message"]


def test_api_server_rejects_schema_violations(cluster: Cluster, namespace: str) -> None:
    doc = spec_doc(algorithm__group_size=0)
    out = apply(cluster, namespace, doc, check=False)
    assert out.returncode != 0
    assert "spec.algorithm.group_size" in out.stderr
    typo = spec_doc(algorithm__group_sizee=8)
    out = apply(cluster, namespace, typo, check=False)
    assert out.returncode != 0 and 'unknown field "spec.algorithm.group_sizee"' in out.stderr
    assert cluster.get_json("experiments", "-n", namespace)["items"] == []


def test_operator_killed_mid_reconcile_restarts_without_duplicates(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    ns = namespace
    apply(cluster, ns)
    # Kill as soon as the Job exists. On the test API server the Job POST is answered 3 s after the write, so
    # the operator dies before it learns the Job was created and before it writes any status.
    wait_until("the grpo Job to be written", lambda: cluster.get_json("jobs", "-n", ns)["items"], interval=0.1)
    operator.kill()
    if cluster.emulated:
        assert not (experiment(cluster, ns).get("status") or {}).get("runName")

    operator.start()
    run = wait_for_run(cluster, ns)
    wait_until(
        "status to show the grpo stage", lambda: experiment(cluster, ns)["status"].get("jobName") == f"{run}-grpo"
    )
    jobs = run_jobs(cluster, ns, run)
    assert [j["metadata"]["name"] for j in jobs] == [f"{run}-grpo"]
    assert len(cluster.get_json("jobs", "-n", ns)["items"]) == 1
    assert len(cluster.get_json("configmaps", "-n", ns, "-l", f"longhaul.dev/run-name={run}")["items"]) == 1
    job_running(cluster, ns, f"{run}-grpo")
    wait_phase(cluster, ns, "Running")
    assert len(cluster.get_json("jobs", "-n", ns)["items"]) == 1


def test_editing_a_running_spec_is_refused(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply(cluster, ns)
    run = wait_for_run(cluster, ns)
    wait_until("the grpo Job", lambda: run_jobs(cluster, ns, run))
    job_running(cluster, ns, f"{run}-grpo")
    wait_phase(cluster, ns, "Running")
    job_before = cluster.get_json("job", f"{run}-grpo", "-n", ns)

    apply(cluster, ns, spec_doc(algorithm__total_steps=400))
    gen = experiment(cluster, ns)["metadata"]["generation"]
    assert gen == 2
    refused = wait_until(
        "SpecChangeRefused",
        lambda: (c := condition(experiment(cluster, ns), "SpecChangeRefused")) and c["status"] == "True" and c,
    )
    assert run in refused["message"] and "new run" in refused["message"]
    exp = experiment(cluster, ns)
    assert exp["status"]["runName"] == run and exp["status"]["phase"] == "Running"
    assert exp["status"]["observedGeneration"] == gen
    job_after = cluster.get_json("job", f"{run}-grpo", "-n", ns)
    assert job_after["spec"] == job_before["spec"]  # never mutated
    assert [j["metadata"]["name"] for j in cluster.get_json("jobs", "-n", ns)["items"]] == [f"{run}-grpo"]

    # Re-applying the running spec clears the refusal; the run goes on.
    apply(cluster, ns)
    wait_until(
        "the refusal to clear", lambda: condition(experiment(cluster, ns), "SpecChangeRefused")["status"] == "False"
    )


def test_failed_job_fails_the_experiment(cluster: Cluster, namespace: str, operator: Operator) -> None:
    ns = namespace
    apply(cluster, ns)
    run = wait_for_run(cluster, ns)
    wait_until("the grpo Job", lambda: run_jobs(cluster, ns, run))
    job_failed(cluster, ns, f"{run}-grpo")
    wait_phase(cluster, ns, "Failed")
    exp = experiment(cluster, ns)
    assert "DeadlineExceeded" in exp["status"]["message"]
    assert condition(exp, "Failed")["status"] == "True"
    assert [j["metadata"]["name"] for j in run_jobs(cluster, ns, run)] == [f"{run}-grpo"]  # eval never started


def test_explain_shows_field_docs(cluster: Cluster) -> None:
    out = cluster.kubectl("explain", "experiment.spec.algorithm.advantage").stdout
    assert "longhaul.dev" in out
    assert "advantage" in out.lower()


def test_chart_renders_and_applies_server_side_dry_run(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    rendered = cluster.helm("template", "lh", str(ROOT / "charts/longhaul"), "--namespace", namespace).stdout
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=rendered)
    assert "deployment.apps/lh-longhaul created (server dry run)" in out.stdout
    assert cluster.get_json("deployments", "-n", namespace)["items"] == []
