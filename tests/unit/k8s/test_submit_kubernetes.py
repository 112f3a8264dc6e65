"""`longhaul submit --backend kubernetes` for single- and multi-seed specs, with kubectl replaced by a fake."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from longhaul.k8s.reconcile import validate_body
from longhaul.render import render
from longhaul.render.kubernetes import render_experiment, render_kubernetes
from longhaul.spec import load_spec, parse_spec_text, resolved_yaml, run_name, seed_runs
from longhaul.submit import kubernetes as K

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"
SHIPPED = [p for p in sorted((ROOT / "specs").glob("*.yaml")) if (GOLDEN / p.stem / "kubernetes.yaml").is_file()]


def smoke_seeds() -> str:
    doc = yaml.safe_load((ROOT / "specs/smoke.yaml").read_text())
    del doc["spec"]["algorithm"]["seed"]
    doc["spec"]["algorithm"]["seeds"] = [7, 8]
    return yaml.safe_dump(doc, sort_keys=False)


class Kubectl:
    """Answers `kubectl apply -o json` with the applied object and `kubectl get` with `self.stored`."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], str | None]] = []
        self.stored: dict[str, Any] = {}

    def __call__(self, argv: list[str], *, input: str | None = None, **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append((argv[1:], input))
        if argv[1] == "apply":
            doc = yaml.safe_load(input or "")
            doc["metadata"].update(namespace="team", uid="u1")
            return subprocess.CompletedProcess(argv, 0, json.dumps(doc), "")
        return subprocess.CompletedProcess(argv, 0, json.dumps(self.stored), "")


def test_a_single_run_applies_its_resolved_spec() -> None:
    exp = load_spec(ROOT / "specs/smoke.yaml")
    assert render_experiment(exp) == resolved_yaml(exp)


@pytest.mark.parametrize("spec", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_submit_ships_exactly_what_the_renderer_returns_for_the_operator(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dry-run is a value on Kubernetes too: `submit` applies the renderer's value for the operator path, the
    Experiment resource of `render_experiment`, and nothing else (one `kubectl apply`, the dry run prints the same
    text); and the operator's render of the resource as applied is exactly what `longhaul render --backend
    kubernetes` prints, the golden file (the ConfigMap and stage workloads the operator creates from it)."""
    monkeypatch.setenv("LONGHAUL_KUBECTL", "kubectl")
    exp = load_spec(spec)
    kubectl = Kubectl()
    dry = K.submit_run(exp, dry_run=True, submit_dir=tmp_path, runner=kubectl)
    assert dry.dry_run and not kubectl.calls
    res = K.submit_run(exp, submit_dir=tmp_path, runner=kubectl)
    ((args, applied),) = kubectl.calls
    assert args[0] == "apply" and applied == dry.script == res.script == render_experiment(exp)
    in_cluster = validate_body(yaml.safe_load(applied))  # what the operator reads back
    assert not isinstance(in_cluster, str), in_cluster
    assert render(in_cluster, "kubernetes").text() == (GOLDEN / spec.stem / "kubernetes.yaml").read_text()


def test_a_multi_seed_submission_renders_the_golden_seed_chains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Experiment applied for a multi-seed spec, from which the operator renders one stage chain per seed: the
    golden `smoke-seeds` objects (rendered into the namespace `default`)."""
    monkeypatch.setenv("LONGHAUL_KUBECTL", "kubectl")
    kubectl = Kubectl()
    K.submit_run(parse_spec_text(smoke_seeds(), file="smoke-seeds.yaml"), submit_dir=tmp_path, runner=kubectl)
    ((_, applied),) = kubectl.calls
    in_cluster = validate_body(yaml.safe_load(applied))
    assert not isinstance(in_cluster, str), in_cluster
    objs = render_kubernetes(in_cluster, namespace="default")
    text = yaml.safe_dump_all(objs, sort_keys=False, width=1_000_000)
    assert text == (GOLDEN / "kubernetes" / "smoke-seeds.yaml").read_text()


def test_a_multi_seed_manifest_validates_as_applied_and_names_the_same_group() -> None:
    exp = parse_spec_text(smoke_seeds(), file="smoke-seeds.yaml")
    text = render_experiment(exp)
    back = parse_spec_text(text, file="applied.yaml")  # the resolved spec with `seed` would be refused
    assert run_name(back) == run_name(exp) and back.spec.algorithm.seeds == [7, 8]
    # As the API server stores it (the CRD defaults `seed`), the operator still reads the same group.
    stored = yaml.safe_load(text)
    stored["spec"]["algorithm"]["seed"] = 42
    stored["metadata"].update(namespace="team", uid="u1")
    assert run_name(validate_body(stored)) == run_name(exp)


def test_submit_and_status_of_a_multi_seed_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGHAUL_KUBECTL", "kubectl")
    exp = parse_spec_text(smoke_seeds(), file="smoke-seeds.yaml")
    kubectl = Kubectl()
    res = K.submit_run(exp, submit_dir=tmp_path, runner=kubectl)
    group = run_name(exp)
    assert res.run_name == group and res.job_id == "team/smoke" and Path(res.run_dir) == tmp_path / "runs" / group
    ((args, applied),) = kubectl.calls
    assert args[:3] == ["apply", "-f", "-"] and applied == render_experiment(
        exp
    )  # one Experiment; the operator expands

    s7, s8 = (run_name(r) for r in seed_runs(exp))
    kubectl.stored = {
        "status": {
            "phase": "Running",
            "runName": group,
            "seeds": "1/2",
            "stage": "grpo",
            "jobName": f"{s8}-grpo",
            "seedRuns": [
                {
                    "seed": 7,
                    "runName": s7,
                    "phase": "Succeeded",
                    "stage": "eval",
                    "jobName": f"{s7}-eval",
                    "lastCheckpointStep": 2,
                },
                {"seed": 8, "runName": s8, "phase": "Running", "stage": "grpo", "jobName": f"{s8}-grpo"},
            ],
        }
    }
    st = K.fetch_status(res.run_dir, runner=kubectl)
    assert st["run_name"] == group and st["seeds"] == "1/2" and st["job"]["job_id"] == f"{s8}-grpo"
    assert [(e["seed"], e["phase"], e["job_id"], e["checkpoint_step"]) for e in st["seed_runs"]] == [
        (7, "Succeeded", f"{s7}-eval", 2),
        (8, "Running", f"{s8}-grpo", None),
    ]
    assert "note" not in st


def test_status_of_a_single_run_has_no_seed_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGHAUL_KUBECTL", "kubectl")
    exp = load_spec(ROOT / "specs/smoke.yaml")
    kubectl = Kubectl()
    res = K.submit_run(exp, submit_dir=tmp_path, runner=kubectl)
    kubectl.stored = {"status": {"phase": "Pending", "runName": run_name(exp), "jobName": f"{run_name(exp)}-grpo"}}
    st = K.fetch_status(res.run_dir, runner=kubectl)
    assert "seeds" not in st and "seed_runs" not in st and st["job"]["phase"] == "Pending"
