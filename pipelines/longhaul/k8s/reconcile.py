"""Reconcile one Experiment: validate → render → adopt → create missing children → write status.

`decide` and `owner_reference` are pure (`longhaul.k8s.decision`); `reconcile_experiment` does the I/O through a
`KubeApi`-like object
(create / get / list / patch_status) so tests can drive it against the emulator or a fake. Idempotent: every
child has a deterministic name, creation treats 409 AlreadyExists as "adopt what is there", and the status is
recomputed from what exists, so retries and operator restarts converge without duplicates.

A multi-seed Experiment (`spec.algorithm.seeds`) is one stage chain per seed run (`longhaul.spec.seed_runs`),
each reconciled exactly like a single run (`longhaul.k8s.runs.reconcile_run`), all owned by the one Experiment;
the status aggregates them (`status.build_group_status`).

A spec edit while a run is active follows the Experiment's spec-change policy (`spec_change_policy`): refused
(the default), or the run is stopped (its unfinished stage workloads deleted, `stop_run`) and the edited spec
starts as a new run, the stopped one ending Superseded in `status.history`.

This module is the operator's entry and exports the decision's and the runs' names too (`__all__`).
"""

from __future__ import annotations

from typing import Any

from longhaul import constants as C
from longhaul.k8s import status as S
from longhaul.k8s.decision import (
    EXPERIMENT_API,
    Decision,
    adopt,
    clean_document,
    decide,
    owner_reference,
    run_locked,
    spec_change_policy,
    validate_body,
)
from longhaul.k8s.runs import Api, Emit, reconcile_group, reconcile_run, stop_run
from longhaul.memory.load import memory_summary
from longhaul.spec import SpecError, parse_spec_text
from longhaul.spec.models import Experiment
from longhaul.spec.naming import group_of, run_name

__all__ = [
    "EXPERIMENT_API",
    "Api",
    "Decision",
    "Emit",
    "adopt",
    "clean_document",
    "decide",
    "load_running",
    "owner_reference",
    "reconcile_experiment",
    "run_locked",
    "spec_change_policy",
    "stop_run",
    "validate_body",
]


async def load_running(api: Api, body: dict[str, Any]) -> Experiment | None:
    """The spec of the active run, read back from its ConfigMap (what the running job mounted).

    For a multi-seed run (the status lists `seedRuns`) the group's spec is rebuilt from a seed run's ConfigMap
    (label `longhaul.dev/seed-group`) and the seeds in the status's order, and accepted only when it names the
    running group again (the spec hash is part of the name).
    """
    status = body.get("status") or {}
    run = status.get("runName")
    if not run_locked(status):
        return None
    ns = body["metadata"].get("namespace")
    if status.get("seedRuns"):
        seeds = [e.get("seed") for e in status["seedRuns"]]
        selector = f"{C.LABEL_SEED_GROUP}={run},app.kubernetes.io/component=spec"
        for cm in await api.list("v1", "ConfigMap", ns, selector):
            one = _parse_configmap(cm)
            if one is None:
                continue
            group = group_of(one, seeds)
            if group is not None and run_name(group) == run:
                return group
        return None
    selector = f"{C.LABEL_RUN_NAME}={run},app.kubernetes.io/component=spec"
    for cm in await api.list("v1", "ConfigMap", ns, selector):
        if (cm.get("data") or {}).get(C.SPEC_FILENAME):
            return _parse_configmap(cm)
    return None


def _parse_configmap(cm: dict[str, Any]) -> Experiment | None:
    text = (cm.get("data") or {}).get(C.SPEC_FILENAME)
    if not text:
        return None
    try:
        # Bounded like every spec read (`longhaul.bounded.SPEC`): a ConfigMap is editable by namespace users.
        return parse_spec_text(text, file=f"configmap {cm['metadata']['name']}")
    except SpecError:
        return None


def _status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """Merge patch turning `old` into `new` (operator keys only; kopf's own `status.kopf` is left alone)."""
    patch = {k: v for k, v in new.items() if old.get(k) != v}
    for key in old:
        if key not in new and key != "kopf" and key in _OPERATOR_KEYS:
            patch[key] = None
    return patch or None


_OPERATOR_KEYS = {
    "memoryPlan",
    "phase",
    "observedGeneration",
    "runName",
    "specHash",
    "stage",
    "jobName",
    "mlflowRunId",
    "mlflowUrl",
    "startTime",
    "completionTime",
    "lastCheckpointStep",
    "message",
    "conditions",
    "seeds",
    "seedRuns",
    "history",
}


async def reconcile_experiment(api: Api, body: dict[str, Any], *, now: str, emit: Emit) -> dict[str, Any]:
    """Bring one Experiment's children and status up to date; returns the status written (or kept)."""
    meta = body["metadata"]
    ns, name, generation = meta.get("namespace"), meta["name"], meta.get("generation")
    previous = {k: v for k, v in (body.get("status") or {}).items() if k in _OPERATOR_KEYS}
    decision = decide(body, await load_running(api, body))
    history = previous.get("history")
    if decision.stop is not None:
        # Before the new run's children: a stop that fails (e.g. no RBAC permission to delete) starts nothing.
        stopped = await stop_run(api, body, decision.stop)
        history = S.supersede_history(history, previous, now=now)
        assert decision.track is not None
        emit(
            "Normal",
            "RunSuperseded",
            f"spec changed (policy {C.SPEC_CHANGE_NEW_RUN}): run {run_name(decision.stop)} stopped "
            f"({', '.join(stopped) or 'no unfinished workload'} deleted; its checkpoints and MLflow run are kept), "
            f"run {run_name(decision.track)} starts",
        )

    if decision.invalid is not None:
        new = S.invalid_status(previous, decision.invalid, generation=generation, now=now)
        if previous.get("history"):
            new["history"] = previous["history"]  # an invalid edit is no run; the runs before it stay listed
        if previous.get("phase") != S.Phase.INVALID or previous.get("message") != decision.invalid:
            emit("Warning", "InvalidSpec", decision.invalid)
        await _write(api, ns, name, previous, new)
        return new

    exp = decision.track
    assert exp is not None
    # The status names a run only after its ConfigMaps exist: later reconciles skip those requests.
    started = previous.get("runName") == run_name(exp)
    base = previous
    if not started:
        # First reconcile, or a finished run's spec was edited (a new run): start a clean status.
        base = {"conditions": [c for c in previous.get("conditions") or [] if c.get("type") == S.COND_VALID]}
    if exp.spec.algorithm.seeds:
        new = await reconcile_group(
            api, body, exp, started=started, base=base, generation=generation, now=now, emit=emit
        )
    else:
        new = await reconcile_run(api, body, exp, started=started, base=base, generation=generation, now=now, emit=emit)
    if decision.refused_run is not None or decision.refused_invalid is not None:
        if not any(
            c.get("type") == S.COND_SPEC_CHANGE_REFUSED
            and c.get("status") == "True"
            and c.get("observedGeneration") == generation
            for c in previous.get("conditions") or []
        ):
            emit("Warning", "SpecChangeRefused", f"spec edit refused while run {run_name(exp)} is active")
        new = S.refused_status(
            new, decision.refused_run, generation=generation, now=now, invalid=decision.refused_invalid
        )
    else:
        new = S.clear_refusal(new, now=now, generation=generation)
    new = {
        **new,
        "memoryPlan": memory_summary(exp),
        "history": S.record_history(history, new, git_commit=_git_commit(body)),
    }
    if new.get("phase") != previous.get("phase") and new.get("phase") in (S.Phase.SUCCEEDED, S.Phase.FAILED):
        emit("Normal" if new["phase"] == S.Phase.SUCCEEDED else "Warning", new["phase"], new.get("message", ""))
    await _write(api, ns, name, previous, new)
    return new


def _git_commit(body: dict[str, Any]) -> str | None:
    """The commit the Experiment was applied from (annotation `longhaul.dev/git-commit`, set by a GitOps tool or
    CI), for `status.history`."""
    value = ((body.get("metadata") or {}).get("annotations") or {}).get(C.ANNOTATION_GIT_COMMIT)
    return str(value) if value else None


async def _write(api: Api, ns: str | None, name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = _status_patch(old, _stable_times(old, new))
    if patch:
        await api.patch_status(EXPERIMENT_API, C.KIND, ns, name, patch)


def _stable_times(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Keep condition timestamps when nothing else about a condition changed (no status churn per reconcile)."""
    olds = {c.get("type"): c for c in old.get("conditions") or []}
    conds = []
    for c in new.get("conditions") or []:
        o = olds.get(c.get("type"))
        if o and {k: v for k, v in o.items() if k != "lastTransitionTime"} == {
            k: v for k, v in c.items() if k != "lastTransitionTime"
        }:
            conds.append(o)
        else:
            conds.append(c)
    return {**new, "conditions": conds} if "conditions" in new else new
