"""Reconcile decisions and idempotent child creation, against an in-memory fake of the API client."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from longhaul import constants as C
from longhaul.k8s import reconcile as RC
from longhaul.k8s.api import ApiError, resource_path
from longhaul.spec import load_spec, run_name

ROOT = Path(__file__).resolve().parents[3]
NOW = "2026-01-01T00:00:00Z"


class FakeApi:
    """Stores objects by (kind, namespace, name); create answers 409 like a server (returns the stored one)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.creates: list[tuple[str, str]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.fail_next_create: str | None = None

    async def create(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        self.creates.append((obj["kind"], obj["metadata"]["name"]))
        if self.fail_next_create == obj["kind"]:
            self.fail_next_create = None
            self.objects[key] = copy.deepcopy(obj)  # written, but the client never hears back
            raise ApiError(504, "Timeout", "lost")
        if key in self.objects:
            return copy.deepcopy(self.objects[key]), False
        self.objects[key] = copy.deepcopy(obj)
        return copy.deepcopy(obj), True

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    async def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        want = dict(part.split("=") for part in label_selector.split(","))
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items()
                if k == kind and ns == namespace and all(o["metadata"]["labels"].get(a) == b for a, b in want.items())]

    async def patch_status(self, api_version: str, kind: str, namespace: str | None, name: str,
                           status: dict[str, Any]) -> dict[str, Any]:
        self.status_patches.append(status)
        return {}


def body(path: str = "specs/prm_lite_lata.yaml", status: dict[str, Any] | None = None, gen: int = 1) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / path).read_text())
    doc["metadata"].update(namespace="ns", uid="uid-1", generation=gen, annotations={
        "kubectl.kubernetes.io/last-applied-configuration": "{}", "kopf.zalando.org/last-handled-configuration": "{}"})
    if status is not None:
        doc["status"] = status
    return doc


def apply_patch(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = {**status, **patch}
    return {k: v for k, v in out.items() if v is not None}


async def reconcile(api: FakeApi, b: dict[str, Any], events: list[tuple[str, str, str]]) -> dict[str, Any]:
    return await RC.reconcile_experiment(api, b, now=NOW, emit=lambda *e: events.append(e))


def test_clean_document_drops_tool_annotations_and_server_fields() -> None:
    b = body()
    b["metadata"].update(resourceVersion="7", managedFields=[{}], creationTimestamp=NOW)
    b["metadata"]["annotations"][C.ANNOTATION_GIT_COMMIT] = "abc"
    clean = RC.clean_document(b)
    assert clean["metadata"] == {"name": "prm-lite-lata", "namespace": "ns", "annotations": {C.ANNOTATION_GIT_COMMIT: "abc"}}


def test_owner_reference_is_a_blocking_controller_reference() -> None:
    assert RC.owner_reference(body()) == {"apiVersion": "longhaul.dev/v1alpha1", "kind": "Experiment",
                                          "name": "prm-lite-lata", "uid": "uid-1", "controller": True,
                                          "blockOwnerDeletion": True}


def test_validate_body_reports_every_problem_and_cross_namespace_targets() -> None:
    b = body()
    b["spec"]["evaluation"]["k"] = [1, 16]
    b["spec"]["algorithm"]["advantage"] = "lata2"
    msg = RC.validate_body(b)
    assert isinstance(msg, str) and "ns/prm-lite-lata" in msg and "lata2" in msg and "max k (16)" in msg
    b = body()
    b["spec"].setdefault("backends", {}).setdefault("kubernetes", {})["namespace"] = "other"
    assert "owner references cannot cross namespaces" in RC.validate_body(b)


async def test_create_is_idempotent_and_stages_are_sequential() -> None:
    api, events = FakeApi(), []
    b = body()
    st = await reconcile(api, b, events)
    run = run_name(load_spec(ROOT / "specs/prm_lite_lata.yaml"))
    assert st["phase"] == "Pending" and st["runName"] == run
    kinds = sorted(k for k, *_ in api.objects)
    assert kinds == ["ConfigMap", "Job"]
    job = api.objects[("Job", "ns", f"{run}-grpo")]
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1" and job["metadata"]["namespace"] == "ns"
    # Run again with the written status (a retry, a restart, a resync): nothing new is created.
    b["status"] = apply_patch({}, api.status_patches[-1])
    n, creates = len(api.status_patches), len(api.creates)
    await reconcile(api, b, events)
    assert sorted(k for k, *_ in api.objects) == ["ConfigMap", "Job"]
    assert len(api.status_patches) == n  # nothing changed → no status write
    assert len(api.creates) == creates  # and no create attempts (the status says the run exists)
    # grpo finishes → eval is created.
    api.objects[("Job", "ns", f"{run}-grpo")]["status"] = {"succeeded": 1}
    st = await reconcile(api, b, events)
    assert ("Job", "ns", f"{run}-eval") in api.objects and st["stage"] == "eval"


async def test_lost_create_answer_is_adopted_on_retry() -> None:
    api, events = FakeApi(), []
    api.fail_next_create = "Job"
    try:
        await reconcile(api, body(), events)
    except ApiError:
        pass
    st = await reconcile(api, body(), events)
    assert st["phase"] == "Pending"
    assert sum(1 for k, *_ in api.objects if k == "Job") == 1


async def test_invalid_spec_creates_nothing_and_emits_one_warning() -> None:
    api, events = FakeApi(), []
    b = body()
    b["spec"]["evaluation"]["k"] = [1, 16]
    st = await reconcile(api, b, events)
    assert st["phase"] == "Invalid" and api.objects == {}
    assert [e[:2] for e in events] == [("Warning", "InvalidSpec")]
    b["status"] = apply_patch({}, api.status_patches[-1])
    await reconcile(api, b, events)
    assert len(events) == 1  # same message: no repeated event


async def test_edit_of_an_active_run_is_refused_and_the_run_is_followed() -> None:
    api, events = FakeApi(), []
    b = body()
    await reconcile(api, b, events)
    status = apply_patch({}, api.status_patches[-1])
    run = status["runName"]
    api.objects[("Job", "ns", f"{run}-grpo")]["status"] = {"active": 1, "ready": 1}
    edited = body(status=status, gen=2)
    edited["spec"]["algorithm"]["total_steps"] = 400
    st = await reconcile(api, edited, events)
    assert st["runName"] == run and st["phase"] == "Running"
    refused = next(c for c in st["conditions"] if c["type"] == "SpecChangeRefused")
    assert refused["status"] == "True" and refused["observedGeneration"] == 2
    assert sum(1 for k, *_ in api.objects if k == "Job") == 1
    # Still refused after the run finished: the edit never starts by itself.
    api.objects[("Job", "ns", f"{run}-grpo")]["status"] = {"succeeded": 1}
    api.objects[("Job", "ns", f"{run}-eval")] = {
        "kind": "Job", "metadata": {"name": f"{run}-eval", "labels": {C.LABEL_RUN_NAME: run}}, "spec": {},
        "status": {"succeeded": 1}}
    st = await reconcile(api, body(status=st, gen=2) | {"spec": edited["spec"]}, events)
    assert st["phase"] == "Succeeded" and st["runName"] == run


def test_resource_paths() -> None:
    assert resource_path("v1", "ConfigMap", "ns") == "/api/v1/namespaces/ns/configmaps"
    assert resource_path("batch/v1", "Job", "ns", "j") == "/apis/batch/v1/namespaces/ns/jobs/j"
    assert resource_path("longhaul.dev/v1alpha1", "Experiment", "ns", "e", "status") == \
        "/apis/longhaul.dev/v1alpha1/namespaces/ns/experiments/e/status"
