"""`longhaul submit SPEC --backend kubernetes` + `longhaul status`: the CLI path to the same operator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from k8s_harness import ROOT, Cluster, Operator, wait_until  # noqa: I001  (tests/e2e/k8s is on sys.path via conftest)

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def longhaul(cluster: Cluster, cwd: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env, "KUBECONFIG": str(kubeconfig), "LONGHAUL_KUBECTL": cluster.kubectl_bin}
    return subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_submit_and_status_through_the_cli(
    cluster: Cluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    # The user's current kubectl context decides the namespace.
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(cluster.kubeconfig, kubeconfig)
    subprocess.run(
        [cluster.kubectl_bin, "config", "set-context", "--current", f"--namespace={namespace}"],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        check=True,
        capture_output=True,
    )
    spec = ROOT / "specs/prm_lite_lata.yaml"

    dry = longhaul(cluster, tmp_path, kubeconfig, "submit", str(spec), "--backend", "kubernetes", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "kind: Experiment" in dry.stdout and "clip_ratio: 0.2" in dry.stdout  # resolved: defaults filled
    assert cluster.get_json("experiments", "-n", namespace)["items"] == []

    sub = longhaul(cluster, tmp_path, kubeconfig, "submit", str(spec), "--backend", "kubernetes")
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.strip() == f"{namespace}/prm-lite-lata"
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "submit.json").read_text())
    assert record["backend"] == "kubernetes" and record["namespace"] == namespace

    run = run_dir.name
    wait_until(
        "the grpo Job",
        lambda: cluster.kubectl("get", "job", f"{run}-grpo", "-n", namespace, check=False).returncode == 0,
    )
    cluster.kubectl(
        "patch",
        "job",
        f"{run}-grpo",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"}}),
    )

    def status() -> dict:
        st = longhaul(cluster, tmp_path, kubeconfig, "status", str(run_dir), "--json")
        assert st.returncode == 0, st.stderr
        return json.loads(st.stdout)

    st = wait_until("phase Running via `longhaul status`", lambda: (s := status())["job"]["phase"] == "Running" and s)
    assert st["run_name"] == run and st["job"]["job_id"] == f"{run}-grpo" and st["stage"] == "grpo"

    # Submitting the same spec again is the same run: nothing new.
    again = longhaul(cluster, tmp_path, kubeconfig, "submit", str(spec), "--backend", "kubernetes")
    assert again.returncode == 0, again.stderr
    assert len(cluster.get_json("jobs", "-n", namespace)["items"]) == 1
