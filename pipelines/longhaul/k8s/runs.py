"""The stage chains of a run (I/O through a `KubeApi`-like object): create what is missing, read what exists.

A run is one stage chain (`reconcile_run`): its ConfigMap, then each stage workload once the previous ones
succeeded; a multi-seed Experiment is one chain per seed run, reconciled concurrently (`reconcile_group`). A run
replaced under the `new-run` policy is stopped by deleting its unfinished workloads (`stop_run`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from longhaul import constants as C
from longhaul.k8s import status as S
from longhaul.k8s.api import ApiError
from longhaul.k8s.decision import adopt
from longhaul.render.kubernetes import render_configmap, render_stage, stage_job_name
from longhaul.spec import seed_runs
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name, spec_hash

Emit = Callable[[str, str, str], None]  # (type Normal|Warning, reason, message)


class Api(Protocol):
    """What reconciling needs from a Kubernetes client (`longhaul.k8s.api.KubeApi`, or a test's fake)."""

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


async def reconcile_run(
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


async def reconcile_group(
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
    """Every seed run of a multi-seed Experiment as its own stage chain (`reconcile_run`, concurrently), and
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
            reconcile_run(
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
