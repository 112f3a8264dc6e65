"""MLflow adapter: one training run per run name, provenance, checkpoints, evaluation child runs.

Every function takes an explicit tracking URI (or an `MlflowClient`): nothing relies on MLflow's global
active-run state, so the launcher, the evaluator and `longhaul compare` can talk to different stores.

Size: over 400 lines because every MLflow run read and write, so the tag schema lives in one module.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.analysis.evalmetrics import build_eval_metrics
from longhaul.analysis.selection import Selection, build_selection_tags
from longhaul.files import PLAIN, atomic_write_text
from longhaul.layout import Paths
from longhaul.spec import Experiment, experiment_family, resolved_yaml, run_name, seed_group, spec_hash
from longhaul.tracking.client import TrackingError, client_for, now_ms, quote_filter, terminate
from longhaul.tracking.config import local_artifact_location
from longhaul.tracking.provenance import build_params, collect_provenance
from longhaul.tracking.relayed import enqueue_if_relayed, mirror_of, needs_relay, probe_server, queue_offline
from longhaul.tracking.seed_group import elect_parent, nest

#: MLflow's per-request limits for log_batch.
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100


@dataclass(frozen=True)
class TrackedRun:
    """The MLflow run of one longhaul run (what the launcher hands to veRL as MLFLOW_RUN_ID)."""

    run_id: str
    experiment_id: str
    experiment_name: str
    run_name: str
    spec_hash: str
    resumed: bool
    attempts: int


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """Id of the MLflow experiment `name`, created when missing (safe when two jobs race to create it).

    A new experiment declares itself a model-training one (`mlflow.experimentKind`); an existing longhaul
    experiment without that tag gets it. In a local sqlite store its artefacts go beside the store
    (`config.local_artifact_location`), not under `./mlruns` of the current directory.
    """
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if T.KIND in exp.tags and T.EXPERIMENT_KIND not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, T.EXPERIMENT_KIND, T.EXPERIMENT_KIND_TRAINING)
        return exp.experiment_id
    try:
        return client.create_experiment(
            name,
            artifact_location=local_artifact_location(client.tracking_uri),
            tags={T.KIND: "family", T.EXPERIMENT_KIND: T.EXPERIMENT_KIND_TRAINING},
        )
    except MlflowException:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def log_batch(
    client: MlflowClient,
    run_id: str,
    *,
    metrics: Iterable[Metric] = (),
    params: Mapping[str, str] | None = None,
    tags: Mapping[str, str] | None = None,
) -> None:
    """log_batch split into chunks within MLflow's per-request limits."""
    ms, ps = list(metrics), [Param(k, str(v)) for k, v in (params or {}).items()]
    ts = [RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()]
    for i in range(0, len(ms), _MAX_METRICS):
        client.log_batch(run_id, metrics=ms[i : i + _MAX_METRICS])
    for i in range(0, len(ps), _MAX_PARAMS):
        client.log_batch(run_id, params=ps[i : i + _MAX_PARAMS])
    for i in range(0, len(ts), _MAX_TAGS):
        client.log_batch(run_id, tags=ts[i : i + _MAX_TAGS])


def log_metrics(tracking_uri: str | MlflowClient, run_id: str, metrics: Mapping[str, float], step: int) -> None:
    """Log several metrics at one step."""
    now = now_ms()
    log_batch(client_for(tracking_uri), run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


# --------------------------------------------------------------------------------------------------------
# Training run: create or resume


def _run_info_file(run_dir: Path) -> Path:
    return Path(Paths.under(str(run_dir)).mlflow_run_file)


def _read_run_info(run_dir: Path) -> dict[str, Any] | None:
    paths = Paths.under(str(run_dir))
    f = Path(paths.mlflow_run_file)
    if f.is_file():
        return json.loads(f.read_text(encoding="utf-8"))
    legacy = Path(paths.mlflow_run_id_file)
    if legacy.is_file():
        return {"run_id": legacy.read_text(encoding="utf-8").strip()}
    return None


def _write_run_info(run_dir: Path, run: TrackedRun) -> None:
    paths = Paths.under(str(run_dir))
    atomic_write_text(paths.mlflow_run_file, json.dumps(asdict(run), indent=2, sort_keys=True) + "\n", mode=PLAIN)
    Path(paths.mlflow_run_id_file).write_text(run.run_id + "\n", encoding="utf-8")


def find_training_run(client: MlflowClient, experiment_id: str, name: str, digest: str) -> str | None:
    """Id of the (oldest active) training run with this run name and spec hash, or None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=(
            f"attributes.run_name = {quote_filter(name)} and tags.`{T.SPEC_HASH}` = {quote_filter(digest)} "
            f"and tags.`{T.KIND}` = {quote_filter(T.KIND_TRAIN)}"
        ),
        order_by=["attributes.start_time ASC"],
        max_results=5,
    )
    return runs[0].info.run_id if runs else None


def _existing_from_run_dir(client: MlflowClient, run_dir: Path, digest: str) -> str | None:
    info = _read_run_info(run_dir)
    if not info or not info.get("run_id"):
        return None
    try:
        run = client.get_run(info["run_id"])
    except MlflowException:
        return None  # another store, or deleted: fall back to the search by name and hash
    if run.info.lifecycle_stage == "deleted":
        return None
    if run.data.tags.get(T.SPEC_HASH) != digest:
        raise TrackingError(
            f"{_run_info_file(run_dir)}: MLflow run {info['run_id']} has spec hash "
            f"{run.data.tags.get(T.SPEC_HASH)!r}, this spec hashes to {digest!r}; the run directory belongs to "
            "another spec — use a fresh run directory"
        )
    return info["run_id"]


def start_or_resume_run(
    exp: Experiment,
    tracking_uri: str | MlflowClient,
    run_dir: str | Path,
    backend: str,
    *,
    environ: Mapping[str, str] | None = None,
) -> TrackedRun:
    """The MLflow run of `exp`: resumed when it exists (run dir record, else run name + spec hash), else created.

    A new run gets provenance tags, spec params and the resolved spec as `spec/experiment.yaml`. A resumed
    run is set back to RUNNING, its attempt counter and job-id history are updated and its provenance tags
    refreshed. The run id is written to `<run_dir>/mlflow_run.json` (and `mlflow_run_id`).
    """
    client = client_for(tracking_uri)
    run_dir = Path(run_dir)
    name, digest, family = run_name(exp), spec_hash(exp), experiment_family(exp)
    provenance = collect_provenance(exp, backend, environ=environ)
    offline = _resume_offline(client.tracking_uri, run_dir, digest, provenance)
    if offline is not None:
        return offline
    experiment_id = ensure_experiment(client, family)

    run_id = _existing_from_run_dir(client, run_dir, digest) or find_training_run(client, experiment_id, name, digest)
    group = seed_group(exp)
    if run_id is None:
        parent = None if group is None else elect_parent(client, experiment_id, group, provenance)
        nesting = {} if parent is None else {T.PARENT_RUN_ID: parent}
        run = client.create_run(
            experiment_id,
            run_name=name,
            tags={**provenance, **nesting, T.ATTEMPTS: "1", T.JOB_IDS: provenance[T.JOB_ID]},
        )
        run_id = run.info.run_id
        if parent is not None:
            nest(client, experiment_id, group, provenance, run_id, parent)
        log_batch(client, run_id, params=build_params(exp))
        client.log_text(run_id, resolved_yaml(exp), f"{T.SPEC_ARTIFACT_DIR}/experiment.yaml")
        attempts, resumed = 1, False
    else:
        run = client.get_run(run_id)
        attempts = int(run.data.tags.get(T.ATTEMPTS, "1")) + 1
        jobs = [j for j in run.data.tags.get(T.JOB_IDS, "").split(",") if j]
        if provenance[T.JOB_ID] not in jobs:
            jobs.append(provenance[T.JOB_ID])
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        log_batch(client, run_id, tags={**provenance, T.ATTEMPTS: str(attempts), T.JOB_IDS: ",".join(jobs)})
        resumed = True
        if group is not None:  # a requeued seed also leaves a parent deleted while it was away
            parent = run.data.tags.get(T.PARENT_RUN_ID) or elect_parent(client, experiment_id, group, provenance)
            nest(client, experiment_id, group, provenance, run_id, parent)
    tracked = TrackedRun(run_id, experiment_id, family, name, digest, resumed, attempts)
    _write_run_info(run_dir, tracked)
    return tracked


#: How long `start_or_resume_run` waits for a tracking server's /health before resuming from the run directory.
PROBE_TIMEOUT_S = 10.0


def _resume_offline(uri: str, run_dir: Path, digest: str, provenance: Mapping[str, str]) -> TrackedRun | None:
    """The recorded run of `run_dir` when the tracking server does not answer (None: it answers, or nothing is
    recorded — then the caller talks to the server, and fails clearly if it is down). The resume bookkeeping
    (status RUNNING, attempt counter, job ids, provenance tags) is queued for the run's relay."""
    if not needs_relay(uri):
        return None
    info = _read_run_info(run_dir)
    if not info or not info.get("run_id") or info.get("spec_hash") not in (None, digest):
        return None
    down = probe_server(uri, PROBE_TIMEOUT_S)
    if down is None:
        return None
    attempts = int(info.get("attempts") or 1) + 1
    tracked = TrackedRun(
        info["run_id"],
        str(info.get("experiment_id", "")),
        str(info.get("experiment_name", "")),
        str(info.get("run_name", "")),
        digest,
        True,
        attempts,
    )
    queue_offline(run_dir, "resume_run", provenance=dict(provenance), token=f"{provenance[T.JOB_ID]}:{now_ms()}")
    _write_run_info(run_dir, tracked)
    print(
        f"MLflow server {uri} unreachable ({down}): resuming run {tracked.run_id} from {_run_info_file(run_dir)}; "
        "its MLflow records are buffered in the run directory until the server answers",
        file=sys.stderr,
    )
    return tracked


def finish_run(tracking_uri: str | MlflowClient, run_id: str, status: str = "FINISHED") -> None:
    """Mark a run FINISHED, FAILED or KILLED (MLflow's "View run" links go to stderr, not stdout). Queued while
    the run is relayed."""
    if enqueue_if_relayed(tracking_uri, run_id, "finish_run", status=status):
        return
    _apply_finish_run(client_for(tracking_uri), run_id, status=status)


def _apply_finish_run(client: MlflowClient, run_id: str, *, status: str) -> None:
    terminate(client, run_id, status)


def mark_requeued(tracking_uri: str | MlflowClient, run_id: str) -> None:
    """Mark a run SCHEDULED with `longhaul.phase=requeued` (the job stopped to be requeued). Queued while the run
    is relayed."""
    if enqueue_if_relayed(tracking_uri, run_id, "mark_requeued"):
        return
    _apply_mark_requeued(client_for(tracking_uri), run_id)


def _apply_mark_requeued(client: MlflowClient, run_id: str) -> None:
    client.set_tag(run_id, "longhaul.phase", "requeued")
    client.update_run(run_id, status="SCHEDULED")


def _apply_resume_run(client: MlflowClient, run_id: str, *, provenance: Mapping[str, str], token: str) -> None:
    """The bookkeeping `start_or_resume_run` does for a resumed run, applied later (once per `token`)."""
    run = client.get_run(run_id)
    if run.data.tags.get(T.RESUME_TOKEN) == token:
        return
    attempts = int(run.data.tags.get(T.ATTEMPTS, "1")) + 1
    jobs = [j for j in run.data.tags.get(T.JOB_IDS, "").split(",") if j]
    if provenance.get(T.JOB_ID) and provenance[T.JOB_ID] not in jobs:
        jobs.append(provenance[T.JOB_ID])
    if run.info.status != RunStatus.to_string(RunStatus.RUNNING):
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
    log_batch(
        client, run_id, tags={**provenance, T.ATTEMPTS: str(attempts), T.JOB_IDS: ",".join(jobs), T.RESUME_TOKEN: token}
    )


# --------------------------------------------------------------------------------------------------------
# Checkpoints


def log_checkpoint(
    tracking_uri: str | MlflowClient,
    run_id: str,
    step: int,
    uri: str,
    *,
    upload_dir: str | Path | None = None,
) -> None:
    """Record a saved checkpoint by URI (tag + `checkpoints/step_<N>.json`); small ones can be uploaded too.
    Queued while the run is relayed."""
    args = {
        "step": step,
        "uri": uri,
        "time_ms": now_ms(),
        "upload_dir": None if upload_dir is None else str(upload_dir),
    }
    if enqueue_if_relayed(tracking_uri, run_id, "log_checkpoint", **args):
        return
    _apply_log_checkpoint(client_for(tracking_uri), run_id, **args)


def _apply_log_checkpoint(
    client: MlflowClient, run_id: str, *, step: int, uri: str, time_ms: int, upload_dir: str | None
) -> None:
    record = {"step": step, "uri": uri, "time_ms": time_ms}
    log_batch(
        client,
        run_id,
        metrics=[Metric("checkpoint/step", float(step), record["time_ms"], step)],
        tags={f"{T.CHECKPOINT_URI_PREFIX}{step}": uri, T.LAST_CHECKPOINT_STEP: str(step)},
    )
    client.log_dict(run_id, record, f"{T.CHECKPOINT_ARTIFACT_DIR}/step_{step:06d}.json")
    if upload_dir is not None:
        client.log_artifacts(run_id, str(upload_dir), f"{T.CHECKPOINT_ARTIFACT_DIR}/step_{step:06d}")


def fetch_checkpoints(tracking_uri: str | MlflowClient, run_id: str) -> dict[int, str]:
    """`{step: uri}` of the checkpoints recorded on a training run."""
    tags = client_for(tracking_uri).get_run(run_id).data.tags
    return {
        int(k[len(T.CHECKPOINT_URI_PREFIX) :]): v
        for k, v in tags.items()
        if k.startswith(T.CHECKPOINT_URI_PREFIX) and k[len(T.CHECKPOINT_URI_PREFIX) :].isdigit()
    }


def fetch_step_metrics(tracking_uri: str | MlflowClient, run_id: str, keys: list[str]) -> dict[int, dict[str, float]]:
    """`{step: {key: value}}` of a run's metric histories for `keys` (the newest value per step wins, so a
    resumed run that repeated a step shows the repetition's value). For a run relayed by this process the
    trainer's metrics are read from the relay's buffer store (complete, and there when the server is not)."""
    mirror = mirror_of(run_id)
    client = client_for(mirror[0] if mirror else tracking_uri)
    out: dict[int, dict[str, float]] = {}
    for key in keys:
        history = [m for rid in (mirror[1] if mirror else [run_id]) for m in client.get_metric_history(rid, key)]
        for m in sorted(history, key=lambda m: m.timestamp):
            out.setdefault(int(m.step), {})[key] = float(m.value)
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------------------------------------
# Evaluation runs (children of the training run)


def find_eval_run(client: MlflowClient, parent_run_id: str, experiment_id: str, step: int) -> str | None:
    """Id of the evaluation run of checkpoint `step` under `parent_run_id`, or None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.`{T.PARENT_RUN_ID}` = {quote_filter(parent_run_id)} and tags.`{T.CHECKPOINT_STEP}` = {quote_filter(str(step))}"  # noqa: E501 - a string literal kept whole
        ),
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def log_evaluation(
    parent_run_id: str,
    checkpoint_step: int,
    summary: Mapping[str, Any],
    jsonl_path: str | Path | None,
    *,
    tracking_uri: str | MlflowClient | None = None,
) -> str | None:
    """Log one checkpoint's evaluation as a child run of the training run; returns the child's run id (None when
    queued: the training run is relayed and the relay creates the child when the server answers).

    The child (named `<run name>-eval-step<N>`, reused when the same checkpoint is evaluated again) gets the
    flattened metrics at step N, the summary as `eval/summary.json`, the per-task JSONL under `eval/`, and the
    parent's grouping tags. The parent gets the same `eval/…` metrics at step N (progression charts) and a tag
    pointing at the child. `tracking_uri` defaults to MLFLOW_TRACKING_URI.
    """
    args = {
        "checkpoint_step": checkpoint_step,
        "summary": dict(summary),
        "time_ms": now_ms(),
        "jsonl_path": None if jsonl_path is None else str(Path(jsonl_path).absolute()),
    }
    if enqueue_if_relayed(tracking_uri, parent_run_id, "log_evaluation", **args):
        return None
    client = client_for(tracking_uri) if tracking_uri is not None else MlflowClient()
    return _apply_log_evaluation(client, parent_run_id, **args)


def _apply_log_evaluation(
    client: MlflowClient,
    parent_run_id: str,
    *,
    checkpoint_step: int,
    summary: Mapping[str, Any],
    jsonl_path: str | None,
    time_ms: int,
) -> str:
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as exc:
        raise TrackingError(
            f"evaluation of step {checkpoint_step}: training run {parent_run_id} not found "
            f"in {client.tracking_uri} ({exc})"
        ) from exc
    ptags = parent.data.tags
    experiment_id = parent.info.experiment_id
    train_name = ptags.get(T.RUN_NAME) or parent.info.run_name
    inherited = {
        k: v
        for k, v in ptags.items()
        if k.startswith(T.PREFIX)
        and not k.startswith((T.CHECKPOINT_URI_PREFIX, T.ALERT_PREFIX, T.VERSION_PREFIX, "longhaul.eval_run."))
    }
    inherited.pop(T.ALERTS, None)
    inherited.pop(T.RESUME_TOKEN, None)
    child_tags = {
        **inherited,
        T.KIND: T.KIND_EVAL,
        T.PARENT_RUN_ID: parent_run_id,
        T.CHECKPOINT_STEP: str(checkpoint_step),
    }
    ckpt_uri = ptags.get(f"{T.CHECKPOINT_URI_PREFIX}{checkpoint_step}")
    if ckpt_uri:
        child_tags[T.CHECKPOINT_URI] = ckpt_uri

    child_id = find_eval_run(client, parent_run_id, experiment_id, checkpoint_step)
    if child_id is None:
        child_id = client.create_run(
            experiment_id, run_name=T.eval_run_name(train_name, checkpoint_step), tags=child_tags
        ).info.run_id
    else:
        client.update_run(child_id, status=RunStatus.to_string(RunStatus.RUNNING))
        log_batch(client, child_id, tags=child_tags)

    flat = build_eval_metrics(summary)
    metrics = [Metric(k, v, time_ms, checkpoint_step) for k, v in flat.items()]
    log_batch(client, child_id, metrics=metrics)
    client.log_dict(child_id, dict(summary), f"{T.EVAL_ARTIFACT_DIR}/summary.json")
    if jsonl_path is not None:
        client.log_artifact(child_id, str(jsonl_path), T.EVAL_ARTIFACT_DIR)
    finish_run(client, child_id)

    log_batch(client, parent_run_id, metrics=metrics, tags={f"longhaul.eval_run.{checkpoint_step}": child_id})
    return child_id


def log_selection(
    tracking_uri: str | MlflowClient,
    run_id: str,
    select_on: str,
    selection: Selection | None,
    reason: str | None = None,
) -> None:
    """Record the checkpoint selection on the training run (`longhaul.analysis.selection`): tags
    `longhaul.select_on`, `longhaul.selected_step` and `longhaul.selected_pass_hat_1`, and the metric
    `selection/pass_hat_1` at the selected step. Without a selection, `longhaul.selection_note` says why and an
    earlier `longhaul.selected_step` is removed. Queued while the run is relayed."""
    args = {
        "select_on": select_on,
        "selection": None if selection is None else asdict(selection),
        "reason": reason,
        "time_ms": now_ms(),
    }
    if enqueue_if_relayed(tracking_uri, run_id, "log_selection", **args):
        return
    _apply_log_selection(client_for(tracking_uri), run_id, **args)


def _apply_log_selection(
    client: MlflowClient,
    run_id: str,
    *,
    select_on: str,
    selection: Mapping[str, Any] | None,
    reason: str | None,
    time_ms: int,
) -> None:
    sel = None if selection is None else Selection(**selection)
    tags = build_selection_tags(select_on, sel, reason)
    metrics = []
    if sel is None:
        stale = client.get_run(run_id).data.tags
        for key in (T.SELECTED_STEP, T.SELECTED_PASS_HAT_1):
            if key in stale:
                client.delete_tag(run_id, key)
    else:
        metrics = [Metric(T.SELECTED_PASS_HAT_1_METRIC, sel.pass_hat_1, time_ms, sel.step)]
    log_batch(client, run_id, metrics=metrics, tags=tags)


#: The operations a relay applies (`longhaul.tracking.relay`): name → function(client, run_id, **args).
OPERATIONS = {
    "log_checkpoint": _apply_log_checkpoint,
    "log_evaluation": _apply_log_evaluation,
    "log_selection": _apply_log_selection,
    "finish_run": _apply_finish_run,
    "mark_requeued": _apply_mark_requeued,
    "resume_run": _apply_resume_run,
}


def apply_operation(client: MlflowClient, run_id: str, op: str, args: Mapping[str, Any]) -> None:
    """Apply one queued operation to the server (idempotent: see the relay's module docstring)."""
    try:
        fn = OPERATIONS[op]
    except KeyError:
        raise TrackingError(f"unknown queued MLflow operation {op!r}; valid: {', '.join(OPERATIONS)}") from None
    fn(client, run_id, **args)


def fetch_eval_runs(tracking_uri: str | MlflowClient, parent_run_id: str) -> dict[int, str]:
    """`{checkpoint step: eval run id}` of a training run's evaluation children."""
    client = client_for(tracking_uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{T.PARENT_RUN_ID}` = {quote_filter(parent_run_id)} and tags.`{T.KIND}` = {quote_filter(T.KIND_EVAL)}",  # noqa: E501 - a string literal kept whole
        max_results=1000,
    )
    return {int(r.data.tags[T.CHECKPOINT_STEP]): r.info.run_id for r in runs}
