"""The operator image, built from images/operator.Dockerfile, reconciles an Experiment on the Kubernetes test API
server (marker `images`; needs kubectl from scripts/ci/k8s-tools.sh as well as podman).

The container runs exactly as in the chart: uid 1000, read-only root filesystem, only /tmp writable, the kopf
entrypoint of the image with the handler file baked in. It reaches the test API server on 127.0.0.1 through the
host network namespace. Cluster and namespace fixtures come from the Kubernetes e2e harness.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))

from k8s_harness import Cluster, wait_until  # noqa: E402

from support.net import free_port  # noqa: E402

pytestmark = [pytest.mark.images, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "prm_lite_lata.yaml"


@pytest.fixture
def operator_container(operator_image: str, cluster: Cluster, namespace: str) -> Iterator[str]:
    """The image's own entrypoint (`kopf run`) watching one namespace; removed by container id afterwards."""
    shared = Path(tempfile.mkdtemp(prefix="longhaul-kube-", dir="/var/tmp"))
    shared.chmod(0o755)
    kubeconfig = shared / "config"
    shutil.copyfile(cluster.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)  # read by uid 1000 inside the container
    port = free_port()
    cid = ""
    try:
        cid = subprocess.run(
            [
                "podman",
                "run",
                "-d",
                "--network",
                "host",
                "--read-only",
                "--read-only-tmpfs=false",
                "--tmpfs",
                "/tmp",
                "-v",
                f"{kubeconfig}:/kube/config:ro",
                "-e",
                "KUBECONFIG=/kube/config",
                "-e",
                "LONGHAUL_OPERATOR_RESYNC_S=5",
                operator_image,
                "--standalone",
                f"--namespace={namespace}",
                f"--liveness=http://127.0.0.1:{port}/healthz",
                "/opt/longhaul/operator/longhaul_operator.py",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()

        def alive() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                state = subprocess.run(
                    ["podman", "inspect", "-f", "{{.State.Running}}", cid], capture_output=True, text=True
                ).stdout.strip()
                if state == "false":
                    logs = subprocess.run(["podman", "logs", cid], capture_output=True, text=True)
                    raise AssertionError(f"operator container exited:\n{logs.stdout}{logs.stderr}") from None
                return False

        wait_until("the operator's liveness endpoint", alive, timeout=90, interval=0.5)
        yield cid
    finally:
        if cid:
            subprocess.run(["podman", "rm", "-f", "-t", "5", cid], capture_output=True, timeout=60)
        shutil.rmtree(shared, ignore_errors=True)


def test_operator_image_reconciles_an_experiment(cluster: Cluster, namespace: str, operator_container: str) -> None:
    started = time.monotonic()
    out = cluster.kubectl("apply", "-n", namespace, "-f", str(SPEC))
    assert "experiment.longhaul.dev/prm-lite-lata created" in out.stdout

    def status() -> dict:
        exp = json.loads(cluster.kubectl("get", "experiment", "prm-lite-lata", "-n", namespace, "-o", "json").stdout)
        return exp.get("status") or {}

    run = wait_until("status.runName written by the containerised operator", lambda: status().get("runName"))
    job = wait_until(
        "the grpo Job",
        lambda: cluster.kubectl("get", "job", f"{run}-grpo", "-n", namespace, "-o", "json", check=False).stdout,
    )
    owner = json.loads(job)["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Experiment", "prm-lite-lata", True)
    assert status()["phase"] in ("Pending", "Running")
    user = subprocess.run(
        ["podman", "inspect", "-f", "{{.Config.User}}", operator_container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert user == "1000:1000"
    print(f"operator image reconciled {run} in {time.monotonic() - started:.1f} s")
