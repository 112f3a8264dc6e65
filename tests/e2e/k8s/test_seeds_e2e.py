"""A multi-seed Experiment end to end: `kubectl apply` of a 2-seed spec, the operator (`kopf run`) runs one stage
chain per seed under the one Experiment, the SEEDS printer column and the phase aggregate them, and an operator
restart in the middle creates nothing twice; `longhaul submit` ships the same Experiment.

Like test_operator_e2e.py: nothing here imports the emulator or the operator, and the tests play the Job
controller by writing Job status.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_harness import ROOT, Cluster, Operator, job_running, job_succeeded, wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NAME = "smoke"
SEED_GROUP = "longhaul.dev/seed-group"


def seeds_doc(seeds: list[int]) -> dict[str, Any]:
    """specs/smoke.yaml with `seeds` instead of `seed: 7`."""
    doc = yaml.safe_load((ROOT / "specs/smoke.yaml").read_text())
    del doc["spec"]["algorithm"]["seed"]
    doc["spec"]["algorithm"]["seeds"] = seeds
    return doc


def experiment(cluster: Cluster, ns: str) -> dict[str, Any]:
    return cluster.get_json("experiment", NAME, "-n", ns)


def status(cluster: Cluster, ns: str) -> dict[str, Any]:
    return experiment(cluster, ns).get("status") or {}


def names(cluster: Cluster, kind: str, ns: str, selector: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in cluster.get_json(kind, "-n", ns, "-l", selector)["items"])


def printed(cluster: Cluster, ns: str) -> dict[str, str]:
    """`kubectl get experiments` as the user sees it: column header → value of the one row (empty cells too)."""
    header, row = cluster.kubectl("get", "experiments", "-n", ns).stdout.splitlines()
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    bounds = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, bounds, strict=True)}


def wait_printed(cluster: Cluster, ns: str, phase: str, seeds: str) -> dict[str, str]:
    return wait_until(
        f"PHASE {phase} and SEEDS {seeds} in `kubectl get experiments`",
        lambda: (p := printed(cluster, ns))["PHASE"] == phase and p["SEEDS"] == seeds and p,
    )


def test_two_seeds_run_two_stage_chains_with_aggregated_status(
    cluster: Cluster, namespace: str, operator: Operator
) -> None:
    ns = namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(seeds_doc([7, 8])))
    group = wait_until("status.runName", lambda: status(cluster, ns).get("runName"))
    s7, s8 = f"{group}-s7", f"{group}-s8"
    in_group = f"{SEED_GROUP}={group}"

    # Two chains started side by side, each with its own ConfigMap; all owned by the one Experiment.
    wait_until("both first stages", lambda: names(cluster, "jobs", ns, in_group) == [f"{s7}-grpo", f"{s8}-grpo"])
    assert names(cluster, "configmaps", ns, in_group) == [f"{s7}-spec", f"{s8}-spec"]
    stored = experiment(cluster, ns)
    uid = stored["metadata"]["uid"]
    # The API server filled in the CRD's default `seed` next to `seeds`; the operator read the spec all the same.
    assert stored["spec"]["algorithm"]["seed"] == 42
    for kind in ("jobs", "configmaps"):
        for obj in cluster.get_json(kind, "-n", ns, "-l", in_group)["items"]:
            (ref,) = obj["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"]) == ("Experiment", NAME, uid)
    cm = cluster.get_json("configmap", f"{s8}-spec", "-n", ns)
    assert yaml.safe_load(cm["data"]["experiment.yaml"])["spec"]["algorithm"]["seed"] == 8
    row = wait_printed(cluster, ns, "Pending", "0/2")
    assert row["RUN"] == group
    st = status(cluster, ns)
    assert [(e["seed"], e["runName"], e["phase"]) for e in st["seedRuns"]] == [(7, s7, "Pending"), (8, s8, "Pending")]

    job_running(cluster, ns, f"{s7}-grpo")
    job_running(cluster, ns, f"{s8}-grpo")
    wait_printed(cluster, ns, "Running", "0/2")

    # The operator dies; meanwhile seed 7's first stage succeeds. The restarted operator starts seed 7's next stage
    # once, adopts everything else, and creates nothing twice.
    operator.kill()
    job_succeeded(cluster, ns, f"{s7}-grpo")
    operator.start()
    wait_until("seed 7's eval Job", lambda: f"{s7}-eval" in names(cluster, "jobs", ns, in_group))
    job_running(cluster, ns, f"{s7}-eval")
    job_succeeded(cluster, ns, f"{s7}-eval")
    row = wait_printed(cluster, ns, "Running", "1/2")  # seed 7 done, seed 8 still running
    assert names(cluster, "jobs", ns, in_group) == [f"{s7}-eval", f"{s7}-grpo", f"{s8}-grpo"]
    assert len(cluster.get_json("jobs", "-n", ns)["items"]) == 3
    assert len(cluster.get_json("configmaps", "-n", ns, "-l", "app.kubernetes.io/component=spec")["items"]) == 2
    st = status(cluster, ns)
    assert [(e["seed"], e["phase"]) for e in st["seedRuns"]] == [(7, "Succeeded"), (8, "Running")]
    assert st["jobName"] == f"{s8}-grpo" and st["seeds"] == "1/2"

    job_succeeded(cluster, ns, f"{s8}-grpo")
    wait_until("seed 8's eval Job", lambda: f"{s8}-eval" in names(cluster, "jobs", ns, in_group))
    wait_printed(cluster, ns, "Pending", "1/2")  # seed 8 between its stages, nothing runs
    job_running(cluster, ns, f"{s8}-eval")
    job_succeeded(cluster, ns, f"{s8}-eval")
    wait_printed(cluster, ns, "Succeeded", "2/2")
    st = status(cluster, ns)
    assert [(e["seed"], e["phase"], e["stage"]) for e in st["seedRuns"]] == [
        (7, "Succeeded", "eval"),
        (8, "Succeeded", "eval"),
    ]
    complete = next(c for c in st["conditions"] if c["type"] == "Complete")
    assert (complete["status"], complete["reason"]) == ("True", "AllSeedsSucceeded") and st["completionTime"]
    assert len(cluster.get_json("jobs", "-n", ns)["items"]) == 4


def test_submit_cli_ships_a_multi_seed_experiment(
    cluster: Cluster, namespace: str, operator: Operator, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copy(cluster.kubeconfig, kubeconfig)
    subprocess.run(
        [cluster.kubectl_bin, "config", "set-context", "--current", f"--namespace={namespace}"],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        check=True,
        capture_output=True,
    )
    spec = tmp_path / "smoke-seeds.yaml"
    spec.write_text(yaml.safe_dump(seeds_doc([3, 4]), sort_keys=False))
    env = {**cluster.env, "KUBECONFIG": str(kubeconfig), "LONGHAUL_KUBECTL": cluster.kubectl_bin}

    def longhaul(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "longhaul.cli", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=120,
        )

    sub = longhaul("submit", str(spec), "--backend", "kubernetes")
    assert sub.returncode == 0, sub.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    group = run_dir.name
    wait_until(
        "both first stages",
        lambda: names(cluster, "jobs", namespace, f"{SEED_GROUP}={group}") == [f"{group}-s3-grpo", f"{group}-s4-grpo"],
    )

    def seeds() -> dict[str, Any]:
        st = longhaul("status", str(run_dir), "--json")
        assert st.returncode == 0, st.stderr
        return json.loads(st.stdout)

    st = wait_until("the seed runs via `longhaul status`", lambda: (s := seeds()).get("seeds") == "0/2" and s)
    assert [(e["seed"], e["run_name"]) for e in st["seed_runs"]] == [(3, f"{group}-s3"), (4, f"{group}-s4")]
    assert st["run_name"] == group and "note" not in st
