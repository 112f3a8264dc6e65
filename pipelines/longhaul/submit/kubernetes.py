"""Kubernetes backend (thin I/O): apply the Experiment resource with kubectl; the operator does the rest.

`submit_run` applies the value the renderer returns for the operator, the resolved Experiment resource
(`longhaul.render.kubernetes.render_experiment`: all defaults filled, the same run hash), with `kubectl apply -f -`,
and nothing else: the operator in the cluster (charts/longhaul) validates it again, renders the ConfigMap
and Jobs with `longhaul.render.kubernetes` and reports progress in the Experiment's status. A multi-seed
Experiment is applied as one resource too: the operator runs one stage chain per seed under it. The submission
is recorded in `runs/<run_name>/submit.json` (the group's run name for a multi-seed Experiment), so
`longhaul status/logs` read the status and the stage Job's logs back through kubectl. kubectl is
`$LONGHAUL_KUBECTL`, else `kubectl` on PATH; the cluster and namespace are kubectl's (`$KUBECONFIG`, current
context) unless the spec names a namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from longhaul import constants as C
from longhaul.files import PLAIN, atomic_write_text
from longhaul.k8s.status import TERMINAL, Phase
from longhaul.layout import DEFAULT_RUNS_DIR
from longhaul.layout import RECORD_FILE as RECORD
from longhaul.render.kubernetes import render_experiment
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name
from longhaul.spec.strings import is_dns1123_label
from longhaul.submit import SubmitResult, read_record

CMD_TIMEOUT_S = 60
Runner = Callable[..., subprocess.CompletedProcess[str]]


class KubectlError(RuntimeError):
    pass


def kubectl_bin() -> str:
    """`$LONGHAUL_KUBECTL`, else kubectl on PATH (scripts/ci/k8s-tools.sh installs a pinned one)."""
    found = os.environ.get(C.ENV_KUBECTL) or shutil.which("kubectl")
    if not found:
        raise KubectlError(f"kubectl not found: install it (scripts/ci/k8s-tools.sh) or set {C.ENV_KUBECTL}")
    return found


def _kubectl(args: list[str], *, input: str | None = None, runner: Runner = subprocess.run) -> str:
    argv = [kubectl_bin(), *args]
    proc = runner(argv, input=input, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise KubectlError(f"kubectl {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def submit_run(
    exp: Experiment, *, dry_run: bool = False, submit_dir: str | Path | None = None, runner: Runner = subprocess.run
) -> SubmitResult:
    """`kubectl apply` the Experiment resource `render_experiment` returns (the dry run returns that text); the same
    spec applied again is the same run (no-op)."""
    run = run_name(exp)
    run_dir = Path(submit_dir or ".") / DEFAULT_RUNS_DIR / run
    text = render_experiment(exp)
    if dry_run:
        return SubmitResult(
            "kubernetes",
            run,
            str(run_dir),
            None,
            text,
            True,
            f"dry run: would `kubectl apply` Experiment {exp.metadata.name} (run {run})",
        )
    ns_args = ["--namespace", exp.metadata.namespace] if exp.metadata.namespace else []
    applied = json.loads(_kubectl(["apply", *ns_args, "-f", "-", "-o", "json"], input=text, runner=runner))
    ns = applied["metadata"].get("namespace", "default")
    record = {
        "backend": "kubernetes",
        "run_name": run,
        "namespace": ns,
        "experiment": exp.metadata.name,
        "uid": applied["metadata"].get("uid"),
        "submitted": time.time(),
    }
    atomic_write_text(run_dir / RECORD, json.dumps(record, indent=2) + "\n", mode=PLAIN)
    return SubmitResult(
        "kubernetes",
        run,
        str(run_dir),
        f"{ns}/{exp.metadata.name}",
        text,
        False,
        f"applied Experiment {ns}/{exp.metadata.name} (run {run}); follow it with "
        f"`kubectl get experiment {exp.metadata.name} -n {ns} -w` or `longhaul status {run_dir}`",
    )


def _record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RECORD
    if not path.is_file():
        raise KubectlError(f"{run_dir}: no Kubernetes submission recorded ({RECORD} missing)")
    return read_record(path, {"experiment": str, "namespace": str, "run_name": str}, {"backend": str})


def fetch_status(run_dir: str | Path, *, runner: Runner = subprocess.run) -> dict[str, object]:
    """The Experiment's status as the operator wrote it (phase, stage, job, MLflow, checkpoint step)."""
    run_dir = Path(run_dir)
    rec = _record(run_dir)
    exp = json.loads(
        _kubectl(
            ["get", f"{C.PLURAL}.{C.API_GROUP}", rec["experiment"], "-n", rec["namespace"], "-o", "json"], runner=runner
        )
    )
    st = exp.get("status") or {}
    # The operator writes `Phase` values itself (`longhaul.k8s.status`): the backend's state is the phase.
    phase = st.get("phase", Phase.PENDING)
    job = {
        "phase": phase,
        "state": phase,
        "job_id": st.get("jobName", ""),
        "reason": st.get("message", ""),
        "terminal": phase in TERMINAL,
    }
    out: dict[str, object] = {
        "run_name": rec["run_name"],
        "run_dir": str(run_dir),
        "backend": "kubernetes",
        "job": job,
        "stage": st.get("stage"),
        "checkpoint_step": st.get("lastCheckpointStep"),
        "mlflow_run_id": st.get("mlflowRunId"),
        "mlflow_url": st.get("mlflowUrl"),
    }
    if st.get("seedRuns"):  # a multi-seed Experiment: `job` follows the seed run in focus, these list them all
        out["seeds"] = st.get("seeds")
        out["seed_runs"] = [
            {
                "seed": e.get("seed"),
                "run_name": e.get("runName"),
                "phase": e.get("phase"),
                "stage": e.get("stage"),
                "job_id": e.get("jobName"),
                "checkpoint_step": e.get("lastCheckpointStep"),
                "mlflow_run_id": e.get("mlflowRunId"),
            }
            for e in st["seedRuns"]
        ]
    if st.get("runName") and st["runName"] != rec["run_name"]:
        out["note"] = f"the Experiment now tracks run {st['runName']} (the spec was changed after this submission)"
    return out


def fetch_experiment(
    name: str, *, namespace: str | None = None, kubeconfig: str | Path | None = None, runner: Runner = subprocess.run
) -> dict[str, Any]:
    """The Experiment object `name` as stored (`kubectl get experiments.longhaul.dev NAME -o json`); the namespace
    and cluster are kubectl's (current context, `$KUBECONFIG`) unless given. Names are checked before kubectl runs:
    a value such as `--server=…` or `-h` would otherwise be read as one of kubectl's options."""
    for what, value in (("name", name), ("namespace", namespace)):
        if value is not None and not is_dns1123_label(value):
            raise KubectlError(
                f"{what} {value!r} is not a Kubernetes name: lowercase letters, digits and '-', starting and ending "
                "with a letter or digit (metadata.name of the spec)"
            )
    args = ["get", f"{C.PLURAL}.{C.API_GROUP}", name, "-o", "json"]
    args += ["--namespace", namespace] if namespace else []
    args += ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    return json.loads(_kubectl(args, runner=runner))


def fetch_logs(run_dir: str | Path, *, follow: bool = False, runner: Runner = subprocess.run) -> Iterator[str]:
    """Logs of the current stage's Job (`kubectl logs job/<name>`)."""
    run_dir = Path(run_dir)
    rec = _record(run_dir)
    status = fetch_status(run_dir, runner=runner)
    job = status["job"]["job_id"] if isinstance(status["job"], dict) else ""
    if not job:
        raise KubectlError(f"{rec['namespace']}/{rec['experiment']}: no Job yet (phase {status['job']})")
    args = ["logs", f"job/{job}", "-n", rec["namespace"], "--all-containers"] + (["-f"] if follow else [])
    if not follow:
        yield _kubectl(args, runner=runner)
        return
    proc = subprocess.Popen([kubectl_bin(), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield from proc.stdout
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)
