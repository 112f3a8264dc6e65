"""longhaul operator: kopf handlers for `Experiment` (longhaul.dev/v1alpha1). Thin on purpose.

Each handler hands the Experiment to `longhaul.k8s.reconcile.reconcile_experiment`, which validates the spec,
renders the children with the pure renderer, creates what is missing (idempotently) and writes the status
(one stage chain per seed run for a multi-seed Experiment, the status aggregated).
Run it: `kopf run --standalone --all-namespaces --liveness=http://0.0.0.0:8080/healthz operator/longhaul_operator.py`
(see operator/README.md).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from typing import Any

import kopf

from longhaul import constants as C
from longhaul.k8s.api import KubeApi
from longhaul.k8s.reconcile import reconcile_experiment

GROUP, VERSION, PLURAL = C.API_GROUP, C.API_VERSION, C.PLURAL
#: Seconds between status re-syncs of active Experiments (covers lost watch events and RayJob/JobSet children).
RESYNC_S = float(os.environ.get(C.ENV_OPERATOR_RESYNC_S, "30"))
#: Seconds for connecting and for each read/write of one request of the operator's own client (then it is retried
#: with back-off, see longhaul.k8s.api.RetryPolicy).
REQUEST_TIMEOUT_S = float(os.environ.get(C.ENV_OPERATOR_REQUEST_TIMEOUT_S, "30"))

_api: KubeApi | None = None
_connection: kopf.ConnectionInfo | None = None
_locks: dict[tuple[str, str], asyncio.Lock] = {}
#: uid → resourceVersion of every stage Job this process has seen (tells a changed Job in a re-listing).
_seen_jobs: dict[str, str] = {}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Explicit login, the same for kopf and our client: in-cluster service account, else kubeconfig.

    kopf's own credential readers, not the `kubernetes` client package: that package (37.x) needs
    python-dateutil>=3 while MLflow's graphene needs <3, so it cannot share an environment with the trainer.
    """
    global _connection
    _connection = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    return _connection


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, logger: logging.Logger, **_: Any) -> None:
    # kopf posts its own log lines as Events at this level; ours are explicit (kopf.event, not filtered by it).
    settings.posting.level = logging.WARNING
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    logger.info("longhaul operator starting", extra={"group": GROUP, "version": VERSION, "resync_s": RESYNC_S})


@kopf.on.cleanup()
async def close(**_: Any) -> None:
    global _api
    if _api is not None:
        await _api.close()
        _api = None


def _client() -> KubeApi:
    global _api
    if _api is None:
        if _connection is None:
            raise kopf.TemporaryError("not logged in yet", delay=1)
        _api = KubeApi.from_connection_info(_connection, timeout=REQUEST_TIMEOUT_S)
    return _api


async def _reconcile(namespace: str, name: str, body: Any, logger: logging.Logger) -> dict[str, Any] | None:
    """Serialise reconciles of one Experiment (handlers and Job events may race) and work on a fresh copy."""
    api = _client()
    lock = _locks.setdefault((namespace, name), asyncio.Lock())
    async with lock:
        fresh = await api.get(f"{GROUP}/{VERSION}", C.KIND, namespace, name)
        gone = fresh is None or bool((fresh.get("metadata") or {}).get("deletionTimestamp"))
        if not gone:
            return await _reconcile_fresh(api, fresh, body, logger)
    _forget(namespace, name)
    return None


def _forget(namespace: str, name: str) -> None:
    """Drop the lock of a deleted Experiment, unless a reconcile still waits on it (that one drops it later).

    Without this the per-Experiment locks grow with every Experiment ever seen (a GitOps repository that creates
    and prunes specs for months would leak one per name).
    """
    lock = _locks.get((namespace, name))
    if lock is not None and not lock.locked():
        del _locks[(namespace, name)]


async def _reconcile_fresh(api: KubeApi, fresh: dict[str, Any], body: Any, logger: logging.Logger) -> dict[str, Any]:
    """One reconcile of the freshly read Experiment (the caller holds its lock)."""

    def emit(kind: str, reason: str, message: str) -> None:
        # kopf.event, not kopf.info/kopf.warn: those are filtered by settings.posting.level (WARNING here), which
        # would drop every Normal Event of ours (Created, RunSuperseded, Succeeded).
        kopf.event(dict(body), type=kind, reason=reason, message=message[:1000])

    status = await reconcile_experiment(api, fresh, now=_now(), emit=emit)
    logger.info(
        "reconciled",
        extra={
            "phase": status.get("phase"),
            "run": status.get("runName"),
            "stage": status.get("stage"),
            "seeds": status.get("seeds"),
        },
    )
    return status


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def experiment_changed(namespace: str, name: str, body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """Create/resume/spec edit: validate, render, create missing children, write status."""
    await _reconcile(namespace, name, body, logger)


@kopf.on.update(
    GROUP, VERSION, PLURAL, id="spec_change_policy", field=("metadata", "annotations", C.ANNOTATION_ON_SPEC_CHANGE)
)
async def spec_change_policy_changed(
    namespace: str, name: str, body: kopf.Body, logger: logging.Logger, **_: Any
) -> None:
    """The spec-change policy annotation changed (a metadata edit, which the `spec` handler does not see): an edit
    refused earlier starts now if the policy became new-run; with the spec matching the run, nothing changes."""
    await _reconcile(namespace, name, body, logger)


@kopf.timer(
    GROUP,
    VERSION,
    PLURAL,
    interval=RESYNC_S,
    initial_delay=RESYNC_S,
    idle=RESYNC_S,
    when=lambda status, **_: (status or {}).get("phase") in ("Pending", "Queued", "Running"),
)
async def resync(namespace: str, name: str, body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """Periodic re-sync of active Experiments (lost events; children kinds the operator does not watch)."""
    await _reconcile(namespace, name, body, logger)


@kopf.on.event("batch", "v1", "jobs", labels={"app.kubernetes.io/managed-by": C.MANAGED_BY})
async def job_event(event: dict[str, Any], body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """A stage Job changed: follow it (phase, times, MLflow annotations) and start the next stage when done."""
    # Only changes matter: the creator accounted for a new Job, and after a restart the resume handler re-reads
    # every Experiment (the first listing arrives with type None). A later listing (kopf lists again when the API
    # server expires a watch: 410 Gone) also arrives with type None: a Job seen before with another
    # resourceVersion changed while nobody watched.
    meta = body.get("metadata", {})
    uid, version, kind = meta.get("uid", ""), meta.get("resourceVersion", ""), event.get("type")
    if kind == "DELETED":
        _seen_jobs.pop(uid, None)
        return
    before = _seen_jobs.get(uid)
    _seen_jobs[uid] = version
    relisted = kind is None and before is not None and before != version
    if not (kind == "MODIFIED" or relisted):
        return
    if relisted:
        logger.info("job changed while unwatched (re-listed)", extra={"resourceVersion": version})
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == C.KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            exp = {
                "apiVersion": ref["apiVersion"],
                "kind": C.KIND,
                "metadata": {"name": ref["name"], "namespace": body["metadata"]["namespace"], "uid": ref.get("uid")},
            }
            await _reconcile(body["metadata"]["namespace"], ref["name"], exp, logger)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def experiment_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    """An Experiment vanished (deleted, or pruned by a GitOps controller): forget its lock."""
    if event.get("type") == "DELETED":
        _forget(namespace, name)


@kopf.on.probe(id="experiments_tracked")
def tracked(**_: Any) -> int:
    """Liveness payload: how many Experiments this process tracks now (deleted ones are forgotten)."""
    return len(_locks)
