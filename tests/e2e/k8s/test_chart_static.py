"""The Helm chart offline: `helm lint --strict`, `helm template` output against the Kubernetes schemas, the
values schema refusing insecure or malformed values, and least-privilege RBAC."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from k8s_harness import ROOT, _tool  # noqa: I001  (tests/e2e/k8s is on sys.path via conftest)

pytestmark = pytest.mark.k8s
CHART = ROOT / "charts/longhaul"


def helm(tmp_path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "c"),
        "HELM_CONFIG_HOME": str(tmp_path / "g"),
        "HELM_DATA_HOME": str(tmp_path / "d"),
    }
    proc = subprocess.run([_tool("helm"), *args], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["--set", "watch.clusterWide=true", "--set", "multinodeEngines={rayjob,jobset}", "--set", "kueue=true"],
        ["--set", "watch.namespaces={team-a,team-b}"],
    ],
    ids=["namespaced", "cluster", "multi-ns"],
)
def test_lint_and_template_validate(tmp_path: Path, sets: list[str]) -> None:
    helm(tmp_path, "lint", "--strict", str(CHART), *sets)
    out = helm(tmp_path, "template", "lh", str(CHART), "--include-crds", "--namespace", "longhaul", *sets).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = sorted({d["kind"] for d in docs})
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32", strict=True)
    assert "CustomResourceDefinition" in kinds and "Deployment" in kinds and "ServiceAccount" in kinds
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert dep["spec"]["replicas"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["args"][-1] == "/opt/longhaul/operator/longhaul_operator.py"
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            # Children are deleted by the garbage collector; the operator deletes only stage workloads, to stop a
            # run for a spec edit under the new-run policy (never ConfigMaps or Experiments).
            if "delete" in rule["verbs"]:
                assert set(rule["resources"]) <= {"jobs", "rayjobs", "jobsets"}, rule
        resources = {r for rule in role["rules"] for r in rule["resources"]}
        assert {"experiments", "experiments/status", "jobs", "configmaps", "events"} <= resources
        assert "secrets" not in resources and "pods" not in resources
    # Kueue's Workloads: read (list) only when the chart is told Kueue is there.
    kueue_rules = [rule for role in roles for rule in role["rules"] if "kueue.x-k8s.io" in rule["apiGroups"]]
    assert kueue_rules == (
        [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]}]
        if "kueue=true" in sets
        else []
    )
    if "--set" in sets and "watch.clusterWide=true" in sets:
        assert [r["kind"] for r in roles] == ["ClusterRole"] and "--all-namespaces" in c["args"]
    else:
        assert all(r["kind"] == "Role" for r in roles) and "--namespace=longhaul" in c["args"]


def test_chart_crd_is_the_generated_one(tmp_path: Path) -> None:
    out = helm(tmp_path, "template", "lh", str(CHART), "--include-crds").stdout
    (crd,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "CustomResourceDefinition"]
    from longhaul.spec.export import build_crd

    assert crd == build_crd()


@pytest.mark.parametrize(
    "bad",
    [
        "securityContext.readOnlyRootFilesystem=false",
        "image.pullPolicy=Sometimes",
        "logFormat=xml",
        "watch.namespaces={Bad_NS}",
        "typo=1",
    ],
)
def test_values_schema_refuses(tmp_path: Path, bad: str) -> None:
    proc = helm(tmp_path, "lint", "--strict", str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0
    assert "schema" in (proc.stdout + proc.stderr).lower()
