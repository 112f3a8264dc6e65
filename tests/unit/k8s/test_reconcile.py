"""Reconcile decisions and idempotent child creation, against an in-memory fake of the API client."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from longhaul import constants as C
from longhaul.k8s import reconcile as RC
from longhaul.k8s.api import ApiError, resource_path
from longhaul.spec import load_spec, run_name, seed_runs
from longhaul.spec.models import Experiment
from longhaul.spec.naming import group_of, spec_hash

ROOT = Path(__file__).resolve().parents[3]
NOW = "2026-01-01T00:00:00Z"


class FakeApi:
    """Stores objects by (kind, namespace, name); create answers 409 like a server (returns the stored one)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.creates: list[tuple[str, str]] = []
        self.status_patches: list[dict[str, Any]] = []
        self.fail_next_create: str | None = None
        #: (kind, name, propagation policy) of every delete call, found or not.
        self.deletes: list[tuple[str, str, str]] = []

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

    async def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str
    ) -> list[dict[str, Any]]:
        want = dict(part.split("=") for part in label_selector.split(","))
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in self.objects.items()
            if k == kind and ns == namespace and all(o["metadata"]["labels"].get(a) == b for a, b in want.items())
        ]

    async def patch_status(
        self, api_version: str, kind: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.status_patches.append(status)
        return {}

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str, *, propagation: str) -> bool:
        self.deletes.append((kind, name, propagation))
        return self.objects.pop((kind, namespace, name), None) is not None


def body(path: str = "specs/prm_lite_lata.yaml", status: dict[str, Any] | None = None, gen: int = 1) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / path).read_text())
    doc["metadata"].update(
        namespace="ns",
        uid="uid-1",
        generation=gen,
        annotations={
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "kopf.zalando.org/last-handled-configuration": "{}",
        },
    )
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
    assert clean["metadata"] == {
        "name": "prm-lite-lata",
        "namespace": "ns",
        "annotations": {C.ANNOTATION_GIT_COMMIT: "abc"},
    }


def test_owner_reference_is_a_blocking_controller_reference() -> None:
    assert RC.owner_reference(body()) == {
        "apiVersion": "longhaul.dev/v1alpha1",
        "kind": "Experiment",
        "name": "prm-lite-lata",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


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
        "kind": "Job",
        "metadata": {"name": f"{run}-eval", "labels": {C.LABEL_RUN_NAME: run}},
        "spec": {},
        "status": {"succeeded": 1},
    }
    st = await reconcile(api, body(status=st, gen=2) | {"spec": edited["spec"]}, events)
    assert st["phase"] == "Succeeded" and st["runName"] == run


def test_resource_paths() -> None:
    assert resource_path("v1", "ConfigMap", "ns") == "/api/v1/namespaces/ns/configmaps"
    assert resource_path("batch/v1", "Job", "ns", "j") == "/apis/batch/v1/namespaces/ns/jobs/j"
    assert (
        resource_path("longhaul.dev/v1alpha1", "Experiment", "ns", "e", "status")
        == "/apis/longhaul.dev/v1alpha1/namespaces/ns/experiments/e/status"
    )


# ---- multi-seed Experiments: one stage chain per seed run under the one Experiment ----


def group_body(
    seeds: list[int] | None = None, status: dict[str, Any] | None = None, gen: int = 1, server_default: bool = True
) -> dict[str, Any]:
    """The smoke spec with `seeds` instead of `seed: 7`, as the API server stores it (it defaults `seed`)."""
    b = body("specs/smoke.yaml", status=status, gen=gen)
    algorithm = b["spec"]["algorithm"]
    del algorithm["seed"]
    algorithm["seeds"] = [7, 8] if seeds is None else seeds
    if server_default:
        algorithm["seed"] = 42  # the CRD's default, filled in by the API server
    return b


def group_spec(seeds: list[int] | None = None) -> Experiment:
    exp = RC.validate_body(group_body(seeds, server_default=False))
    assert isinstance(exp, Experiment), exp
    return exp


def jobs(api: FakeApi) -> list[str]:
    return sorted(n for k, _, n in api.objects if k == "Job")


async def test_a_multi_seed_experiment_runs_one_stage_chain_per_seed() -> None:
    api, events = FakeApi(), []
    b = group_body()
    st = await reconcile(api, b, events)
    group = run_name(group_spec())
    s7, s8 = f"{group}-s7", f"{group}-s8"
    assert (st["runName"], st["phase"], st["seeds"]) == (group, "Pending", "0/2")
    assert [(e["seed"], e["runName"], e["phase"], e["jobName"]) for e in st["seedRuns"]] == [
        (7, s7, "Pending", f"{s7}-grpo"),
        (8, s8, "Pending", f"{s8}-grpo"),
    ]
    # Each seed run: its own ConfigMap with its resolved single-seed spec, its first stage; all owned by the one
    # Experiment and labelled with the group.
    assert sorted(n for k, _, n in api.objects if k == "ConfigMap") == [f"{s7}-spec", f"{s8}-spec"]
    assert jobs(api) == [f"{s7}-grpo", f"{s8}-grpo"]
    for obj in api.objects.values():
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert obj["metadata"]["labels"][C.LABEL_SEED_GROUP] == group
    mounted = yaml.safe_load(api.objects[("ConfigMap", "ns", f"{s8}-spec")]["data"][C.SPEC_FILENAME])
    assert mounted["spec"]["algorithm"]["seed"] == 8 and mounted["spec"]["algorithm"]["seeds"] is None
    assert {e[1] for e in events} == {"Created"} and len(events) == 4

    # Idempotent: the same status again creates and writes nothing.
    b["status"] = apply_patch({}, api.status_patches[-1])
    n, creates = len(api.status_patches), len(api.creates)
    await reconcile(api, b, events)
    assert (len(api.status_patches), len(api.creates)) == (n, creates)

    # Seed 7 runs ahead: its eval starts after its grpo; seed 8's chain is untouched.
    api.objects[("Job", "ns", f"{s8}-grpo")]["status"] = {"active": 1, "ready": 1}
    api.objects[("Job", "ns", f"{s7}-grpo")]["status"] = {"succeeded": 1}
    st = await reconcile(api, b, events)
    assert jobs(api) == [f"{s7}-eval", f"{s7}-grpo", f"{s8}-grpo"]
    assert (st["phase"], st["seeds"], st["jobName"]) == ("Running", "0/2", f"{s8}-grpo")
    b["status"] = apply_patch(b["status"], api.status_patches[-1])
    api.objects[("Job", "ns", f"{s7}-eval")]["status"] = {"succeeded": 1}
    st = await reconcile(api, b, events)
    assert (st["phase"], st["seeds"]) == ("Running", "1/2") and ("Normal", "SeedSucceeded") in [e[:2] for e in events]
    # Seed 8 fails: the group has finished, and failed.
    b["status"] = apply_patch(b["status"], api.status_patches[-1])
    api.objects[("Job", "ns", f"{s8}-grpo")]["status"] = {"failed": 1}
    st = await reconcile(api, b, events)
    assert (st["phase"], st["seeds"], st["jobName"]) == ("Failed", "1/2", f"{s8}-grpo")
    assert [e[:2] for e in events[-2:]] == [("Warning", "SeedFailed"), ("Warning", "Failed")]
    assert jobs(api) == [f"{s7}-eval", f"{s7}-grpo", f"{s8}-grpo"]  # seed 8's eval never started


async def test_a_group_adopts_what_exists_after_a_lost_answer_or_a_restart() -> None:
    api, events = FakeApi(), []
    api.fail_next_create = "Job"  # the first seed's Job is written, its answer lost
    try:
        await reconcile(api, group_body(), events)
    except ApiError:
        pass
    assert api.status_patches == []  # no status before every chain was reconciled
    # A restarted operator: the same body (no status), everything adopted, nothing twice.
    st = await reconcile(api, group_body(), events)
    assert st["seeds"] == "0/2" and len(jobs(api)) == 2
    assert sum(1 for k, *_ in api.objects if k == "ConfigMap") == 2


async def test_a_single_seed_list_is_a_group_of_one() -> None:
    api, events = FakeApi(), []
    st = await reconcile(api, group_body([5]), events)
    assert st["seeds"] == "0/1" and jobs(api) == [f"{run_name(group_spec([5]))}-s5-grpo"]


def test_the_servers_seed_default_is_accepted_next_to_seeds_and_any_other_seed_refused() -> None:
    assert isinstance(RC.validate_body(group_body()), Experiment)
    b = group_body()
    b["spec"]["algorithm"]["seed"] = 3  # set by the user: refused as by the CLI
    msg = RC.validate_body(b)
    assert isinstance(msg, str) and "not both" in msg
    assert run_name(RC.validate_body(group_body())) == run_name(group_spec())


@pytest.mark.parametrize("seeds", [[7, 8], [8, 7], [3, 11, 2]])
def test_group_of_inverts_seed_runs(seeds: list[int]) -> None:
    exp = group_spec(seeds)
    for r in seed_runs(exp):
        back = group_of(r, seeds)
        assert back is not None and run_name(back) == run_name(exp) and back.spec == exp.spec
    assert group_of(exp, seeds) is None  # not a seed run
    assert group_of(seed_runs(exp)[0], [99]) is None  # its seed is not in the list


async def test_edit_of_an_active_group_is_refused_and_the_group_is_followed() -> None:
    api, events = FakeApi(), []
    await reconcile(api, group_body(), events)
    status = apply_patch({}, api.status_patches[-1])
    group = status["runName"]
    api.objects[("Job", "ns", f"{group}-s7-grpo")]["status"] = {"active": 1, "ready": 1}
    # The running group's spec is read back from its seed runs' ConfigMaps.
    running = await RC.load_running(api, group_body(status=status))
    assert running is not None and run_name(running) == group

    edited = group_body(status=status, gen=2)
    edited["spec"]["algorithm"]["total_steps"] = 400
    st = await reconcile(api, edited, events)
    assert (st["runName"], st["phase"], st["seeds"]) == (group, "Running", "0/2")
    refused = next(c for c in st["conditions"] if c["type"] == "SpecChangeRefused")
    assert refused["status"] == "True" and refused["observedGeneration"] == 2
    assert len(jobs(api)) == 2
    # Another seed list is another group: refused the same way.
    st = await reconcile(api, group_body([7, 8, 9], status=st, gen=3), events)
    assert st["runName"] == group and len(jobs(api)) == 2
    # Re-applying the running spec clears the refusal.
    st = await reconcile(api, group_body(status=st, gen=4), events)
    assert next(c for c in st["conditions"] if c["type"] == "SpecChangeRefused")["status"] == "False"


async def test_a_tampered_seed_configmap_is_not_taken_for_the_running_group() -> None:
    api, events = FakeApi(), []
    await reconcile(api, group_body(), events)
    status = apply_patch({}, api.status_patches[-1])
    for (kind, _, _), obj in api.objects.items():
        if kind == "ConfigMap":
            obj["data"][C.SPEC_FILENAME] = obj["data"][C.SPEC_FILENAME].replace("total_steps: 2", "total_steps: 3")
    assert await RC.load_running(api, group_body(status=status)) is None


async def test_a_finished_single_run_edited_into_a_group_starts_the_group() -> None:
    api, events = FakeApi(), []
    b = body("specs/smoke.yaml")
    await reconcile(api, b, events)
    status = apply_patch({}, api.status_patches[-1])
    single = status["runName"]
    for stage in ("grpo", "eval"):
        api.objects[("Job", "ns", f"{single}-{stage}")] = {
            "kind": "Job",
            "metadata": {
                "name": f"{single}-{stage}",
                "labels": {C.LABEL_RUN_NAME: single},
                "annotations": {C.ANNOTATION_MLFLOW_RUN_ID: "m1"},
            },
            "spec": {},
            "status": {"succeeded": 1},
        }
    st = await reconcile(api, body("specs/smoke.yaml", status=status), events)
    status = apply_patch(status, api.status_patches[-1])
    assert st["phase"] == "Succeeded" and "seeds" not in st and st["mlflowRunId"] == "m1"
    st = await reconcile(api, group_body(status=status, gen=2), events)
    assert st["runName"] == run_name(group_spec()) and st["seeds"] == "0/2"
    patch = api.status_patches[-1]
    assert patch["mlflowRunId"] is None and patch["completionTime"] is None  # the single run's keys are dropped


async def test_status_carries_the_memory_plan_and_its_verdict() -> None:
    from longhaul.memory.load import load_memory_plan

    api, events = FakeApi(), []
    st = await reconcile(api, body(), events)
    plan = load_memory_plan(RC.validate_body(body()))
    assert st["memoryPlan"].startswith("fits: rollout ")
    for phase in plan.phases:
        assert f"{phase.name} " in st["memoryPlan"]
    # Past capacity (a 48 GB L40S for a plan sized for 80 GB A800s), the verdict says so.
    small = body()
    small["spec"]["resources"]["gpu_type"] = "l40s"
    st = await reconcile(FakeApi(), small, [])
    assert st["memoryPlan"].startswith("DOES NOT FIT: ") and " OVER" in st["memoryPlan"], st["memoryPlan"]


# ---- spec-change policy: annotation longhaul.dev/on-spec-change (refuse | new-run) ----


def with_policy(b: dict[str, Any], policy: str) -> dict[str, Any]:
    b["metadata"]["annotations"][C.ANNOTATION_ON_SPEC_CHANGE] = policy
    return b


def edited_body(status: dict[str, Any], policy: str | None, gen: int = 2, **algorithm: Any) -> dict[str, Any]:
    b = body(status=status, gen=gen)
    b["spec"]["algorithm"].update(algorithm or {"total_steps": 400})
    return with_policy(b, policy) if policy else b


def refused(st: dict[str, Any]) -> bool:
    return any(c["type"] == "SpecChangeRefused" and c["status"] == "True" for c in st.get("conditions") or [])


def test_decide_refuses_by_default_and_stops_the_active_run_under_new_run() -> None:
    running = RC.validate_body(body())
    assert isinstance(running, Experiment)
    old = run_name(running)
    status = {"runName": old, "phase": "Running", "conditions": []}
    new = run_name(RC.validate_body(edited_body(status, None)))
    assert new != old
    for policy in (None, C.SPEC_CHANGE_REFUSE):  # absent = refuse: today's behaviour
        d = RC.decide(edited_body(status, policy), running)
        assert (d.track, d.refused_run, d.stop) == (running, new, None)
    d = RC.decide(edited_body(status, C.SPEC_CHANGE_NEW_RUN), running)
    assert run_name(d.track) == new and d.stop is running and d.refused_run is None and d.refused_invalid is None
    # Queued and Pending runs are active too: stopped the same way.
    for phase in ("Queued", "Pending"):
        assert RC.decide(edited_body({**status, "phase": phase}, C.SPEC_CHANGE_NEW_RUN), running).stop is running
    # The policy alone (the running spec, the annotation switched): the same run, nothing stopped.
    d = RC.decide(with_policy(body(status=status, gen=2), C.SPEC_CHANGE_NEW_RUN), running)
    assert run_name(d.track) == old and d.stop is None and d.refused_run is None
    # An invalid edit is refused under new-run as well: the run continues.
    bad = edited_body(status, C.SPEC_CHANGE_NEW_RUN)
    bad["spec"]["evaluation"]["k"] = [1, 16]
    d = RC.decide(bad, running)
    assert d.track is running and d.refused_invalid and d.stop is None
    # A finished run held by an earlier refusal: under new-run the edit starts, and there is nothing to stop.
    held = {**status, "phase": "Succeeded", "conditions": [{"type": "SpecChangeRefused", "status": "True"}]}
    d = RC.decide(edited_body(held, C.SPEC_CHANGE_NEW_RUN), running)
    assert run_name(d.track) == new and d.stop is None and d.refused_run is None
    assert RC.decide(edited_body(held, None), running).refused_run == new


def test_the_policy_is_validated_and_not_part_of_the_run_name() -> None:
    plain = RC.validate_body(body())
    for policy in C.SPEC_CHANGE_POLICIES:
        exp = RC.validate_body(with_policy(body(), policy))
        assert isinstance(exp, Experiment) and RC.spec_change_policy(exp) == policy
        assert run_name(exp) == run_name(plain) and spec_hash(exp) == spec_hash(plain)
    assert RC.spec_change_policy(plain) == C.SPEC_CHANGE_REFUSE
    msg = RC.validate_body(with_policy(body(), "new_run"))
    assert isinstance(msg, str) and C.ANNOTATION_ON_SPEC_CHANGE in msg and "refuse or new-run" in msg


async def start_running(api: FakeApi, b: dict[str, Any], events: list[tuple[str, str, str]]) -> dict[str, Any]:
    """Reconcile `b` until its grpo Job runs and reports an MLflow run and a checkpoint; the written status."""
    await reconcile(api, b, events)
    status = apply_patch({}, api.status_patches[-1])
    job = api.objects[("Job", "ns", f"{status['runName']}-grpo")]
    job["status"] = {"active": 1, "ready": 1, "startTime": NOW}
    job["metadata"]["annotations"] = {C.ANNOTATION_MLFLOW_RUN_ID: "m-old", C.ANNOTATION_CHECKPOINT_STEP: "40"}
    await reconcile(api, {**b, "status": status}, events)
    return apply_patch(status, api.status_patches[-1])


async def test_new_run_policy_stops_the_active_run_and_starts_the_edit_once() -> None:
    api, events = FakeApi(), []
    status = await start_running(api, with_policy(body(), C.SPEC_CHANGE_NEW_RUN), events)
    old = status["runName"]
    assert (status["phase"], status["mlflowRunId"], status["lastCheckpointStep"]) == ("Running", "m-old", 40)
    edited = edited_body(status, C.SPEC_CHANGE_NEW_RUN)
    edited["metadata"]["annotations"][C.ANNOTATION_GIT_COMMIT] = "c2"
    new = run_name(RC.validate_body(edited))
    configmap_before = copy.deepcopy(api.objects[("ConfigMap", "ns", f"{old}-spec")])

    st = await reconcile(api, edited, events)
    assert (st["runName"], st["phase"], st["jobName"]) == (new, "Pending", f"{new}-grpo")
    assert not refused(st) and "mlflowRunId" not in st and "lastCheckpointStep" not in st
    # The old run's Job was deleted with foreground propagation; the new run's children were created; the old
    # run's ConfigMap (its resolved spec) is untouched; nothing else was deleted (checkpoints live on the
    # checkpoint volume and MLflow runs in MLflow, which longhaul.k8s cannot import: lint-imports).
    assert api.deletes == [("Job", f"{old}-grpo", "Foreground")]
    assert jobs(api) == [f"{new}-grpo"]
    assert api.objects[("ConfigMap", "ns", f"{old}-spec")] == configmap_before
    assert ("ConfigMap", "ns", f"{new}-spec") in api.objects
    assert st["history"] == [
        {
            "runName": old,
            "specHash": status["specHash"],
            "phase": "Superseded",
            "mlflowRunId": "m-old",
            "startTime": NOW,
            "completionTime": NOW,
        },
        {"runName": new, "specHash": st["specHash"], "phase": "Pending", "gitCommit": "c2"},
    ]
    (superseded,) = [e for e in events if e[1] == "RunSuperseded"]
    assert superseded[0] == "Normal" and f"{old}-grpo deleted" in superseded[2] and f"run {new} starts" in superseded[2]

    # Reconciled again with the written status (a resync, a Job event): nothing is created, deleted or written.
    after = apply_patch(status, api.status_patches[-1])
    n, creates, deletes = len(api.status_patches), len(api.creates), len(api.deletes)
    st2 = await reconcile(api, {**edited, "status": after}, events)
    assert (len(api.status_patches), len(api.creates), len(api.deletes)) == (n, creates, deletes)
    assert st2["history"] == st["history"] and len([e for e in events if e[1] == "RunSuperseded"]) == 1
    # The first reconcile repeated (its status write lost: the status still names the old run): the same
    # children and the same history, no second entry of either run.
    st3 = await reconcile(api, {**edited, "status": status}, events)
    assert jobs(api) == [f"{new}-grpo"] and st3["history"] == st["history"] and st3["runName"] == new


async def test_new_run_policy_keeps_finished_stages_and_the_old_spec_resumes_its_run() -> None:
    api, events = FakeApi(), []
    b = with_policy(body(), C.SPEC_CHANGE_NEW_RUN)
    status = await start_running(api, b, events)
    old = status["runName"]
    # grpo finished, eval runs: only eval is stopped.
    api.objects[("Job", "ns", f"{old}-grpo")]["status"] = {"succeeded": 1, "startTime": NOW}
    await reconcile(api, {**b, "status": status}, events)
    status = apply_patch(status, api.status_patches[-1])
    api.objects[("Job", "ns", f"{old}-eval")]["status"] = {"active": 1, "ready": 1}
    await reconcile(api, {**b, "status": status}, events)
    status = apply_patch(status, api.status_patches[-1])
    assert (status["stage"], status["phase"]) == ("eval", "Running")
    edited = edited_body(status, C.SPEC_CHANGE_NEW_RUN)
    await reconcile(api, edited, events)
    new_status = apply_patch(status, api.status_patches[-1])
    new = new_status["runName"]
    assert api.deletes == [("Job", f"{old}-eval", "Foreground")]
    assert jobs(api) == sorted([f"{old}-grpo", f"{new}-grpo"])
    # The old spec applied again: the new run is stopped and the old run goes on where it was stopped (its
    # finished grpo stands, its eval starts again; veRL resumes a stage from its newest checkpoint).
    api.objects[("Job", "ns", f"{new}-grpo")]["status"] = {"active": 1, "ready": 1}
    back = with_policy(body(status=new_status, gen=3), C.SPEC_CHANGE_NEW_RUN)
    st = await reconcile(api, back, events)
    assert (st["runName"], st["stage"]) == (old, "eval")
    assert api.deletes[-1] == ("Job", f"{new}-grpo", "Foreground")
    assert jobs(api) == sorted([f"{old}-eval", f"{old}-grpo"])
    assert [(h["runName"], h["phase"]) for h in st["history"]] == [
        (old, "Superseded"),
        (new, "Superseded"),
        (old, "Pending"),
    ]


async def test_new_run_policy_refuses_an_invalid_edit_and_ignores_a_policy_switch() -> None:
    api, events = FakeApi(), []
    status = await start_running(api, body(), events)  # no annotation: refuse
    run = status["runName"]
    # The policy alone, switched either way: the same run, no object created or deleted.
    for policy in (C.SPEC_CHANGE_NEW_RUN, C.SPEC_CHANGE_REFUSE, C.SPEC_CHANGE_NEW_RUN):
        creates = len(api.creates)
        st = await reconcile(api, with_policy(body(status=status, gen=1), policy), events)
        assert st["runName"] == run and not refused(st) and len(api.creates) == creates and api.deletes == []
        assert len(st["history"]) == 1
    # An invalid edit under new-run: refused, the run continues.
    bad = edited_body(status, C.SPEC_CHANGE_NEW_RUN)
    bad["spec"]["evaluation"]["k"] = [1, 16]
    st = await reconcile(api, bad, events)
    assert st["runName"] == run and st["phase"] == "Running" and refused(st) and api.deletes == []
    assert "also invalid" in next(c for c in st["conditions"] if c["type"] == "SpecChangeRefused")["message"]
    assert jobs(api) == [f"{run}-grpo"] and len(st["history"]) == 1
    # A valid edit refused under refuse, then the policy switched to new-run: the refused edit starts now.
    edited = edited_body(status, None, gen=3)
    st = await reconcile(api, edited, events)
    status = apply_patch(status, api.status_patches[-1])
    assert st["runName"] == run and refused(st) and api.deletes == []
    st = await reconcile(api, with_policy(edited_body(status, None, gen=3), C.SPEC_CHANGE_NEW_RUN), events)
    assert st["runName"] == run_name(RC.validate_body(edited)) and not refused(st)
    assert api.deletes == [("Job", f"{run}-grpo", "Foreground")]
    assert [h["phase"] for h in st["history"]] == ["Superseded", "Pending"]


async def test_new_run_policy_stops_every_seed_run_of_a_group_and_only_its_own_workloads() -> None:
    api, events = FakeApi(), []
    await reconcile(api, with_policy(group_body(), C.SPEC_CHANGE_NEW_RUN), events)
    status = apply_patch({}, api.status_patches[-1])
    group = status["runName"]
    api.objects[("Job", "ns", f"{group}-s7-grpo")]["status"] = {"active": 1, "ready": 1}
    # A Job with the group's label that this Experiment does not control is never deleted.
    stranger = copy.deepcopy(api.objects[("Job", "ns", f"{group}-s8-grpo")])
    stranger["metadata"]["ownerReferences"][0]["uid"] = "uid-other"
    api.objects[("Job", "ns", f"{group}-s8-grpo")] = stranger
    edited = with_policy(group_body(status=status, gen=2), C.SPEC_CHANGE_NEW_RUN)
    edited["spec"]["algorithm"]["total_steps"] = 400
    st = await reconcile(api, edited, events)
    new = st["runName"]
    assert new != group and st["seeds"] == "0/2"
    assert api.deletes == [("Job", f"{group}-s7-grpo", "Foreground")]
    assert jobs(api) == sorted([f"{group}-s8-grpo", f"{new}-s7-grpo", f"{new}-s8-grpo"])
    assert [(h["runName"], h["phase"]) for h in st["history"]] == [(group, "Superseded"), (new, "Pending")]
