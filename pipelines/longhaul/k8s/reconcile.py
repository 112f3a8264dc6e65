"""Reconcile one Experiment: validate → render → adopt → create missing children → write status.

`decide` and `owner_reference` are pure; `reconcile_experiment` does the I/O through a `KubeApi`-like object
(create / get / list / patch_status) so tests can drive it against the emulator or a fake. Idempotent: every
child has a deterministic name, creation treats 409 AlreadyExists as "adopt what is there", and the status is
recomputed from what exists, so retries and operator restarts converge without duplicates.

A multi-seed Experiment (`spec.algorithm.seeds`) is one stage chain per seed run (`longhaul.spec.seed_runs`),
each reconciled exactly like a single run (`_reconcile_run`), all owned by the one Experiment; the status
aggregates them (`status.build_group_status`).

A spec edit while a run is active follows the Experiment's spec-change policy (`spec_change_policy`): refused
(the default), or the run is stopped (its unfinished stage workloads deleted, `stop_run`) and the edited spec
starts as a new run, the stopped one ending Superseded in `status.history`.

Size: over 400 lines because the reconcile sequence (decide, stop a superseded run, create children, write status)
reads top to bottom.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from longhaul import bounded
from longhaul import constants as C
from longhaul.k8s import status as S
from longhaul.k8s.api import ApiError
from longhaul.memory.load import memory_summary
from longhaul.render.kubernetes import render_configmap, render_stage, stage_job_name
from longhaul.spec import SpecError, build_experiment, parse_spec_text, seed_runs
from longhaul.spec.models import Experiment
from longhaul.spec.naming import group_of, run_name, spec_hash

#: Annotation prefixes written by tools, not by users: never part of the Experiment that is validated.
_TOOL_ANNOTATIONS = ("kubectl.kubernetes.io/", "kopf.zalando.org/", "meta.helm.sh/", "argocd.argoproj.io/")
EXPERIMENT_API = f"{C.API_GROUP}/{C.API_VERSION}"

Emit = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message)


class Api(Protocol):
    async def create(self, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...
    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    async def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str
    ) -> list[dict[str, Any]]: ...
    async def patch_status(
        self, api_version: str, kind: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]: ...
    async def delete(
        self, api_version: str, kind: str, namespace: str | None, name: str, *, propagation: str
    ) -> bool: ...


def clean_document(body: dict[str, Any]) -> dict[str, Any]:
    """The user's Experiment from a stored object: server fields and tool annotations dropped."""
    meta = body.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(_TOOL_ANNOTATIONS)}
    clean_meta: dict[str, Any] = {"name": meta.get("name")}
    if meta.get("namespace"):
        clean_meta["namespace"] = meta["namespace"]
    if meta.get("labels"):
        clean_meta["labels"] = dict(meta["labels"])
    if annotations:
        clean_meta["annotations"] = annotations
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": clean_meta,
        "spec": copy.deepcopy(body.get("spec") or {}),
    }


def validate_body(body: dict[str, Any]) -> Experiment | str:
    """The validated Experiment, or the full multi-line error message (every problem, with field paths)."""
    meta = body.get("metadata") or {}
    where = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    try:
        # Bounded before the deep copy in clean_document (depth and node limits of `longhaul.bounded.SPEC`).
        bounded.check_data({"spec": body.get("spec")}, where, bounded.SPEC)
        exp = build_experiment(clean_document(body), file=where)
    except (bounded.InputError, SpecError) as exc:
        return str(exc)
    ns = meta.get("namespace")
    target = exp.spec.backends.kubernetes.namespace
    if target and ns and target != ns:
        return (
            f"{where} spec.backends.kubernetes.namespace: {target!r} differs from the Experiment's namespace "
            f"{ns!r}; the operator creates jobs next to their Experiment (owner references cannot cross "
            "namespaces): remove the field or apply the Experiment into that namespace"
        )
    return exp


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """Controller owner reference to the Experiment: deleting it garbage-collects every child."""
    meta = body["metadata"]
    return {
        "apiVersion": body.get("apiVersion", EXPERIMENT_API),
        "kind": body.get("kind", C.KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(objs: list[dict[str, Any]], body: dict[str, Any]) -> list[dict[str, Any]]:
    """Make freshly rendered `objs` owned by the Experiment, in its namespace (in place; returns them)."""
    for obj in objs:
        obj["metadata"]["namespace"] = body["metadata"]["namespace"]
        obj["metadata"]["ownerReferences"] = [owner_reference(body)]
    return objs


@dataclass(frozen=True)
class Decision:
    """What to do with an Experiment: `track` a run (maybe refusing an edit, or stopping the run it replaces) or
    report it `invalid`."""

    track: Experiment | None = None
    invalid: str | None = None
    refused_run: str | None = None  # the run name the edited spec would have had
    refused_invalid: str | None = None  # the edited spec's validation errors (the run continues)
    stop: Experiment | None = None  # policy new-run: the spec of the active run that `track` replaces


def decide(body: dict[str, Any], running: Experiment | None) -> Decision:
    """Pure decision. `running` is the spec of the active run (from its ConfigMap), when one is active.

    A valid edit of a locked run is refused, unless the edited Experiment's policy (`spec_change_policy`) is
    new-run: then an active run is stopped for it, and a finished run whose earlier edit was refused simply
    gives way to it. An invalid edit is refused under either policy (the run continues).
    """
    result = validate_body(body)
    status = body.get("status") or {}
    locked = run_locked(status)
    if isinstance(result, str):
        if locked and running is not None:
            return Decision(track=running, refused_invalid=result)
        return Decision(invalid=result)
    if locked and running is not None and run_name(result) != status["runName"]:
        if spec_change_policy(result) == C.SPEC_CHANGE_NEW_RUN:
            return Decision(track=result, stop=running if status.get("phase") in S.ACTIVE else None)
        return Decision(track=running, refused_run=run_name(result))
    return Decision(track=result)


def spec_change_policy(exp: Experiment) -> str:
    """What a spec edit of the Experiment's active run does: C.SPEC_CHANGE_REFUSE (the default) or
    C.SPEC_CHANGE_NEW_RUN, from the annotation `longhaul.dev/on-spec-change` (validated by the spec models).

    An annotation, not a spec field, because the policy is about the Experiment object, not the run: the spec
    hash (`longhaul.spec.naming.canonical_document`) covers the whole spec and leaves metadata out by design, so
    setting or switching the policy alone never makes a new run; a spec field would be hashed, and one dropped
    from the dump would be missing from the resolved spec `longhaul submit` applies. Like `longhaul.dev/git-commit`,
    a GitOps tool can stamp it on every Experiment of a repository (e.g. kustomize `commonAnnotations`).
    """
    return exp.metadata.annotations.get(C.ANNOTATION_ON_SPEC_CHANGE, C.SPEC_CHANGE_REFUSE)


def run_locked(status: dict[str, Any]) -> bool:
    """Whether the spec is bound to the current run: while it is active, and after an edit was refused.

    A refused edit stays refused after the run finishes (it never starts by itself); re-applying the run's
    spec clears it. Editing a finished run without a refusal starts a new run.
    """
    if not status.get("runName"):
        return False
    refused = any(
        c.get("type") == S.COND_SPEC_CHANGE_REFUSED and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return status.get("phase") in S.ACTIVE or refused


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
        new = await _reconcile_group(
            api, body, exp, started=started, base=base, generation=generation, now=now, emit=emit
        )
    else:
        new = await _reconcile_run(
            api, body, exp, started=started, base=base, generation=generation, now=now, emit=emit
        )
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


async def stop_run(api: Api, body: dict[str, Any], running: Experiment) -> list[str]:
    """Stop the run of `running` (all its seed runs): delete its unfinished stage workloads of this Experiment,
    with C.STOP_PROPAGATION_POLICY, so their pods get SIGTERM and their grace period. Returns the names deleted.

    Finished workloads stay (their pods' logs, and a re-applied spec of this run resumes after them); so does
    the run's ConfigMap, which holds its resolved spec. Nothing else is touched: checkpoints live in the run
    directory on the checkpoint volume, MLflow runs in MLflow, which this package cannot reach.
    """
    ns = body["metadata"].get("namespace")
    uid = body["metadata"].get("uid")
    run = run_name(running)
    rendered = [render_stage(r, s, namespace=ns) for r in seed_runs(running) for s in r.spec.stages]
    wanted = {(o["apiVersion"], o["kind"], o["metadata"]["name"]) for o in rendered}
    selector = f"{C.LABEL_SEED_GROUP if running.spec.algorithm.seeds else C.LABEL_RUN_NAME}={run}"
    deleted = []
    for api_version, kind in sorted({(a, k) for a, k, _ in wanted}):
        for obj in await api.list(api_version, kind, ns, selector):
            meta = obj.get("metadata") or {}
            ours = any(r.get("uid") == uid and r.get("controller") for r in meta.get("ownerReferences") or [])
            if (api_version, kind, meta.get("name")) not in wanted or not ours or meta.get("deletionTimestamp"):
                continue
            if S.workload_phase(obj) in (S.Phase.SUCCEEDED, S.Phase.FAILED):
                continue
            if await api.delete(api_version, kind, ns, meta["name"], propagation=C.STOP_PROPAGATION_POLICY):
                deleted.append(meta["name"])
    return sorted(deleted)


async def _reconcile_run(
    api: Api,
    body: dict[str, Any],
    exp: Experiment,
    *,
    started: bool,
    base: dict[str, Any],
    generation: int | None,
    now: str,
    emit: Emit,
    listed: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One stage chain (a single-seed Experiment, or one seed run of a group): its ConfigMap unless `started`,
    the next stage workload when the previous ones succeeded, and its status (`status.build_status`).

    `listed`: the stage workloads already read (a group lists all its seed runs' at once), else listed here.
    """
    ns = body["metadata"].get("namespace")
    run = run_name(exp)
    # The same objects as render_run(exp), rendered piecewise: the ConfigMap (a YAML dump of the whole spec)
    # only when it may be missing.
    workloads = adopt([render_stage(exp, s, namespace=ns) for s in exp.spec.stages], body)
    if not started:
        (configmap,) = adopt([render_configmap(exp, namespace=ns)], body)
        _, created = await api.create(configmap)
        if created:
            emit("Normal", "Created", f"ConfigMap {configmap['metadata']['name']} (resolved spec of run {run})")

    stages = [str(s) for s in exp.spec.stages]
    by_stage = dict(zip(stages, workloads, strict=True))
    if listed is None:
        # One list call for all stages (by run label), matched by the deterministic names.
        first = workloads[0]
        listed = await api.list(first["apiVersion"], first["kind"], ns, f"{C.LABEL_RUN_NAME}={run}")
    by_name = {o["metadata"]["name"]: o for o in listed}
    current: dict[str, dict[str, Any] | None] = {s: by_name.get(wl["metadata"]["name"]) for s, wl in by_stage.items()}

    admissions: dict[str, S.Admission] = {}
    queue = exp.spec.backends.kubernetes.queue
    for s, obj in current.items():
        if queue and obj is not None and S.workload_phase(obj) == S.Phase.QUEUED:
            admissions[s] = S.kueue_admission(await _kueue_workload(api, obj), queue)

    def views() -> list[S.StageView]:
        return [
            S.StageView(stage=s, name=stage_job_name(exp, s), workload=current[s], admission=admissions.get(s))
            for s in stages
        ]

    result = S.build_status(base, views(), run_name=run, spec_hash=spec_hash(exp), generation=generation, now=now)
    if result.next_stage is not None:
        wl = by_stage[result.next_stage]
        stored, created = await api.create(wl)
        current[result.next_stage] = stored
        if queue and S.workload_phase(stored) == S.Phase.QUEUED:
            # Just created: Kueue has not made its Workload yet (the next reconcile reads it).
            admissions[result.next_stage] = S.kueue_admission(None, queue)
        if created:
            emit("Normal", "Created", f"{wl['kind']} {wl['metadata']['name']} for stage {result.next_stage}")
        result = S.build_status(base, views(), run_name=run, spec_hash=spec_hash(exp), generation=generation, now=now)
    return result.status


async def _kueue_workload(api: Api, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The Kueue `Workload` Kueue made for a stage workload (found by its job-uid label), or None: not made yet,
    Kueue not installed (404), or the operator may not read Workloads (403: the chart's `kueue` value is off).
    Only read for a queued workload, to say why it waits."""
    meta = obj.get("metadata") or {}
    try:
        found = await api.list(
            C.KUEUE_WORKLOAD_API, "Workload", meta.get("namespace"), f"{C.LABEL_KUEUE_JOB_UID}={meta.get('uid')}"
        )
    except ApiError as exc:
        if exc.status in (403, 404):
            return None
        raise
    return found[0] if found else None


async def _reconcile_group(
    api: Api,
    body: dict[str, Any],
    exp: Experiment,
    *,
    started: bool,
    base: dict[str, Any],
    generation: int | None,
    now: str,
    emit: Emit,
) -> dict[str, Any]:
    """Every seed run of a multi-seed Experiment as its own stage chain (`_reconcile_run`, concurrently), and
    the aggregated status (`status.build_group_status`)."""
    ns = body["metadata"].get("namespace")
    group = run_name(exp)
    runs = seed_runs(exp)
    before = {e.get("runName"): e for e in base.get("seedRuns") or []}
    # One list call for every seed run's stages (by group label); each chain matches its deterministic names.
    first = render_stage(runs[0], runs[0].spec.stages[0])
    listed = await api.list(first["apiVersion"], first["kind"], ns, f"{C.LABEL_SEED_GROUP}={group}")
    results = await asyncio.gather(
        *(
            _reconcile_run(
                api,
                body,
                r,
                started=started,
                base=before.get(run_name(r)) or {},
                generation=None,
                now=now,
                emit=emit,
                listed=listed,
            )
            for r in runs
        ),
        return_exceptions=True,
    )  # every chain gets its turn; the first error is raised after all finished
    for res in results:
        if isinstance(res, BaseException):
            raise res
    entries = [S.seed_run_entry(r.spec.algorithm.seed, st) for r, st in zip(runs, results, strict=True)]
    for e in entries:
        if (
            e["phase"] in (S.Phase.SUCCEEDED, S.Phase.FAILED)
            and (before.get(e["runName"]) or {}).get("phase") != e["phase"]
        ):
            emit(
                "Normal" if e["phase"] == S.Phase.SUCCEEDED else "Warning",
                f"Seed{e['phase']}",
                f"seed {e['seed']} (run {e['runName']}): {e['message']}",
            )
    return S.build_group_status(base, entries, run_name=group, spec_hash=spec_hash(exp), generation=generation, now=now)


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
