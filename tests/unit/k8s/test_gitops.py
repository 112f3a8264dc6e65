"""The GitOps examples next to the chart (charts/longhaul/examples/gitops/) against the real CRD schemas of
Argo CD v3.5.1 (Application) and Flux (kustomize-controller v1.9.4 Kustomization, source-controller v1.9.1
GitRepository), vendored unmodified under tests/fixtures/crds/ (hashes checked in test_kueue_multinode.py)."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "tests/fixtures/crds"
EXAMPLES = ROOT / "charts/longhaul/examples/gitops"
sys.path.insert(0, str(ROOT / "tests/support"))
from kube_emulator import schema as crd_schema  # noqa: E402  (kube-apiserver's prune → default → validate)

GITOPS_CRDS = {
    ("argoproj.io/v1alpha1", "Application"): "argo-cd-v3.5.1/application-crd.yaml",
    (
        "kustomize.toolkit.fluxcd.io/v1",
        "Kustomization",
    ): "kustomize-controller-v1.9.4/kustomize.toolkit.fluxcd.io_kustomizations.yaml",
    (
        "source.toolkit.fluxcd.io/v1",
        "GitRepository",
    ): "source-controller-v1.9.1/source.toolkit.fluxcd.io_gitrepositories.yaml",
}


@functools.cache
def _schema(path: str, version: str) -> dict[str, Any]:
    crd = yaml.load((CRDS / path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return ver["schema"]["openAPIV3Schema"]


def admit(obj: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """What kube-apiserver does to the object with the project's CRD installed: (pruned fields, violations)."""
    schema = _schema(GITOPS_CRDS[(obj["apiVersion"], obj["kind"])], obj["apiVersion"].split("/")[1])
    obj = copy.deepcopy(obj)
    pruned = crd_schema.prune(obj, schema)
    crd_schema.default(obj, schema)
    return pruned, crd_schema.validate(obj, schema)


def _examples() -> list[Path]:
    return sorted(EXAMPLES.rglob("*.yaml"))


def test_there_is_an_example_for_argocd_and_for_flux() -> None:
    kinds = {(p.parent.name, yaml.safe_load(p.read_text())["kind"]) for p in _examples()}
    assert kinds == {("argocd", "Application"), ("flux", "Kustomization"), ("flux", "GitRepository")}


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_examples_pass_the_real_crd_schemas(path: Path) -> None:
    pruned, problems = admit(yaml.safe_load(path.read_text()))
    assert pruned == [] and problems == [], (pruned, problems)


def test_examples_prune_and_target_the_operators_namespace() -> None:
    docs = {yaml.safe_load(p.read_text())["kind"]: yaml.safe_load(p.read_text()) for p in _examples()}
    app, ks, repo = docs["Application"], docs["Kustomization"], docs["GitRepository"]
    assert app["spec"]["syncPolicy"]["automated"]["prune"] is True
    assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    assert app["spec"]["source"]["kustomize"]["commonAnnotations"] == {
        "longhaul.dev/git-commit": "${ARGOCD_APP_REVISION}"
    }
    assert ks["spec"]["prune"] is True and ks["spec"]["sourceRef"] == {
        "kind": "GitRepository",
        "name": repo["metadata"]["name"],
    }
    assert app["spec"]["destination"]["namespace"] == ks["spec"]["targetNamespace"] == "longhaul"


def test_the_schema_check_catches_a_mistake() -> None:
    (path,) = [p for p in _examples() if p.parent.name == "flux" and "kustomization" in p.name]
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["prune"] = "yes"
    doc["spec"]["sourceRef"]["kind"] = "GitRepo"
    doc["spec"]["pruning"] = True
    pruned, problems = admit(doc)
    assert pruned == ["spec.pruning"]
    assert sorted(f for f, _ in problems) == ["spec.prune", "spec.sourceRef.kind"]
