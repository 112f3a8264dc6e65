"""Harness of the Kubernetes end-to-end tests: a cluster (the test API server, or a real one), kubectl, helm,
the CRD from the chart, a namespace per test and the operator as a separate `kopf run` process.

These tests use only what a user runs — `kubectl`, `helm`, `kopf run` — and never import the emulator or the
operator, so they run unchanged against a real cluster:

    LONGHAUL_E2E_KUBECONFIG=~/.kube/config pytest -m k8s tests/e2e/k8s     # e.g. a kind cluster

Without LONGHAUL_E2E_KUBECONFIG each test session starts the emulator (tests/support/run_kube_emulator.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from support.net import free_port, wait_http

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = ROOT / "charts/longhaul/crds/experiments.longhaul.dev.yaml"
OPERATOR_FILE = ROOT / "operator/longhaul_operator.py"
EMULATOR = ROOT / "tests/support/run_kube_emulator.py"


def _tool(name: str) -> str:
    """kubectl/helm: $KUBECTL/$HELM, then .cache/bin (scripts/ci/k8s-tools.sh), then PATH."""
    env = os.environ.get(name.upper())
    if env:
        return env
    local = ROOT / ".cache/bin" / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run scripts/ci/k8s-tools.sh (installs pinned kubectl and helm into .cache/bin)")
    return found


def stop(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM) -> None:
    """Stop one process we started (by PID), escalating to SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@dataclass
class Cluster:
    kubeconfig: Path
    emulated: bool
    workdir: Path
    kubectl_bin: str = field(default_factory=lambda: _tool("kubectl"))
    helm_bin: str = field(default_factory=lambda: _tool("helm"))

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            KUBECACHEDIR=str(self.workdir / "kubecache"),
            HELM_CACHE_HOME=str(self.workdir / "helm/cache"),
            HELM_CONFIG_HOME=str(self.workdir / "helm/config"),
            HELM_DATA_HOME=str(self.workdir / "helm/data"),
        )
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.kubectl_bin, *args], input=input, capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.helm_bin, *args], capture_output=True, text=True, env=self.env, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
        return proc


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The emulator as a process (default) or the cluster in $LONGHAUL_E2E_KUBECONFIG; the CRD applied."""
    workdir = tmp_path_factory.mktemp("k8s")
    real = os.environ.get("LONGHAUL_E2E_KUBECONFIG")
    proc = None
    try:
        if real:
            cl = Cluster(kubeconfig=Path(real).expanduser(), emulated=False, workdir=workdir)
        else:
            port = free_port()
            log = workdir / "emulator.log"
            kubeconfig = workdir / "kubeconfig"
            with log.open("w") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        str(EMULATOR),
                        "--port",
                        str(port),
                        "--kubeconfig",
                        str(kubeconfig),
                        "--access-log",
                        "--delay",
                        "POST:jobs=3",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )
            wait_http(f"http://127.0.0.1:{port}/version", 60, proc=proc, log=log)
            cl = Cluster(kubeconfig=kubeconfig, emulated=True, workdir=workdir)
        # Exactly what a user does: the CRD from the chart, then wait until it is served.
        cl.kubectl("apply", "-f", str(CRD_FILE))
        cl.kubectl("wait", "--for=condition=Established", "crd/experiments.longhaul.dev", "--timeout=60s")
        yield cl
    finally:
        stop(proc)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test (created the way the emulator and real clusters both accept)."""
    name = f"lh-e2e-{uuid.uuid4().hex[:8]}"
    manifest = cluster.kubectl("create", "namespace", name, "--dry-run=client", "-o", "json").stdout
    cluster.kubectl("apply", "-f", "-", input=manifest)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


class Operator:
    """`kopf run` as a separate process, watching one namespace, with its liveness endpoint."""

    def __init__(self, cluster: Cluster, namespace: str, workdir: Path) -> None:
        self.cluster, self.namespace, self.workdir = cluster, namespace, workdir
        self.proc: subprocess.Popen[Any] | None = None
        self.starts = 0
        #: Extra environment of the operator process (overrides, e.g. LONGHAUL_OPERATOR_RESYNC_S).
        self.env: dict[str, str] = {}

    def kopf_args(self, port: int) -> list[str]:
        """The `kopf run …` arguments (after `python -m kopf`)."""
        return [
            "run",
            "--standalone",
            f"--namespace={self.namespace}",
            f"--liveness=http://127.0.0.1:{port}/healthz",
            "--log-format=json",
            str(OPERATOR_FILE),
        ]

    def process_env(self) -> dict[str, str]:
        return {**self.cluster.env, "LONGHAUL_OPERATOR_RESYNC_S": "5", **self.env}

    def start(self) -> None:
        port = free_port()
        self.starts += 1
        self.log = self.workdir / f"operator-{self.starts}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kopf", *self.kopf_args(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=self.process_env(),
            )
        self.health_url = f"http://127.0.0.1:{port}/healthz"
        wait_http(self.health_url, 60, proc=self.proc, log=self.log)

    def probes(self) -> dict[str, Any]:
        """The operator's liveness payload (kopf's probe results, e.g. `experiments_tracked`)."""
        with urllib.request.urlopen(self.health_url, timeout=5) as resp:
            return json.loads(resp.read())

    def kill(self) -> None:
        """SIGKILL: no cleanup, no final status write — like a node loss."""
        stop(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        stop(self.proc)

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("operator-*.log")))


#: Run by WarmOperator's spare: import what the operator imports, wait for a line on stdin, then run the kopf CLI
#: (`kopf.cli.main()`, what `python -m kopf` runs) with the arguments after `-c CODE`.
_WARM_KOPF = """
import sys
import kopf.cli, longhaul.k8s.api, longhaul.k8s.reconcile
sys.stdin.readline()
kopf.cli.main()
"""


class WarmOperator(Operator):
    """An Operator that keeps its next process ready: Python started and the operator's imports done, waiting
    before `kopf run` begins. A restart after SIGKILL then costs kopf's startup only (the imports take seconds on a
    loaded machine), which keeps tests with many kill/restart cycles short. What runs is the same `kopf run` with
    the same arguments as `Operator.start`."""

    def __init__(self, cluster: Cluster, namespace: str, workdir: Path) -> None:
        super().__init__(cluster, namespace, workdir)
        self.spare: tuple[subprocess.Popen[Any], int, Path] | None = None

    def _spawn(self) -> tuple[subprocess.Popen[Any], int, Path]:
        port = free_port()
        self.starts += 1
        log = self.workdir / f"operator-{self.starts}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WARM_KOPF, *self.kopf_args(port)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=self.process_env(),
            )
        return proc, port, log

    def start(self, wait: bool = True) -> None:
        """Let the spare run (spawning one first if there is none) and spawn the next spare.

        `wait`: return once the liveness endpoint answers (else at once)."""
        proc, port, log = self.spare or self._spawn()
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        self.proc, self.log = proc, log
        self.spare = self._spawn()
        if wait:
            wait_http(f"http://127.0.0.1:{port}/healthz", 60, proc=proc, log=log)

    def stop(self) -> None:
        super().stop()
        if self.spare is not None:
            stop(self.spare[0], signal.SIGKILL)
            self.spare = None


@pytest.fixture
def operator(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Operator]:
    op = Operator(cluster, namespace, tmp_path)
    op.start()
    try:
        yield op
    finally:
        op.stop()


def wait_until(what: str, fn: Callable[[], Any], timeout: float = 60, interval: float = 0.3) -> Any:
    """Poll `fn` until it returns something truthy; fail with `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


# ---- the Job controller, played by the tests (nothing runs pods on the test API server) ----


def job_status(cluster: Cluster, ns: str, job: str, status: dict[str, Any]) -> None:
    """Play the Job controller: write the Job's status subresource."""
    cluster.kubectl(
        "patch", "job", job, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status})
    )


def job_running(cluster: Cluster, ns: str, job: str) -> None:
    job_status(cluster, ns, job, {"startTime": "2026-01-01T00:00:00Z", "active": 1, "ready": 1})


def job_succeeded(cluster: Cluster, ns: str, job: str) -> None:
    now = "2026-01-01T01:00:00Z"
    job_status(
        cluster,
        ns,
        job,
        {
            "startTime": "2026-01-01T00:00:00Z",
            "completionTime": now,
            "active": 0,
            "ready": 0,
            "succeeded": 1,
            "conditions": [
                {
                    "type": "SuccessCriteriaMet",
                    "status": "True",
                    "reason": "CompletionsReached",
                    "lastTransitionTime": now,
                },
                {"type": "Complete", "status": "True", "reason": "CompletionsReached", "lastTransitionTime": now},
            ],
        },
    )


def job_failed(cluster: Cluster, ns: str, job: str) -> None:
    now = "2026-01-01T01:00:00Z"
    job_status(
        cluster,
        ns,
        job,
        {
            "startTime": "2026-01-01T00:00:00Z",
            "active": 0,
            "ready": 0,
            "failed": 1,
            "conditions": [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                    "lastTransitionTime": now,
                },
            ],
        },
    )
