"""Where a run's MLflow data goes: the tracking URI rules and the environment handed to veRL.

No MLflow import here: the launcher decides (and refuses) before anything is started.

Rules, in order:

1. `spec.tracking.uri` — used as given, on every backend.
2. `spec.tracking.uri_secret` — the URI lives in a Kubernetes Secret; the Job injects it as
   `MLFLOW_TRACKING_URI` (secretKeyRef), so in the pod it is read from the environment.
3. `MLFLOW_TRACKING_URI` exported by the user or the site (Slurm jobs inherit the submit environment).
4. Local backend only: an explicit store path (CLI), else `sqlite:///<run_dir>/mlflow.db` (for the seed runs of
   a multi-seed Experiment, one store for all of them: `sqlite:///<run_dir>/../<group run name>/mlflow.db`).

Anything else is refused: veRL's MLflow logger would otherwise write to `sqlite:////tmp/mlruns.db`, a file
that disappears with the container.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from longhaul.analysis import tags as T
from longhaul.constants import ENV_RUN_NAME
from longhaul.layout import MLFLOW_ARTIFACTS_SUBDIR, MLFLOW_STORE_FILE
from longhaul.redact import redact_uri
from longhaul.spec import Experiment, experiment_family, run_name, seed_group
from longhaul.spec.backends import Backend

ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"
ENV_RUN_ID = "MLFLOW_RUN_ID"
#: The store veRL silently falls back to when MLFLOW_TRACKING_URI is unset.
VERL_FALLBACK_URI = "sqlite:////tmp/mlruns.db"
#: Where `mlflow ui` serves when given no --host/--port.
UI_DEFAULT_URL = "http://127.0.0.1:5000"

_LOCAL_SCHEMES = ("sqlite:", "file:")


class TrackingConfigError(ValueError):
    """No usable tracking URI: says which field or variable to set."""


def local_store_uri(path: str | Path) -> str:
    """`sqlite:///<absolute path>` for a store file (a directory gets `mlflow.db` inside it)."""
    p = Path(path).expanduser()
    if p.suffix != ".db":
        p = p / MLFLOW_STORE_FILE
    return f"sqlite:///{p.absolute()}"


def sqlite_store_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///…` tracking URI, made absolute (a relative one is relative to the current
    directory, as SQLAlchemy reads it); None for other stores and in-memory sqlite."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    # `sqlite:////abs/x.db` leaves `/abs/x.db`, `sqlite:///rel/x.db` leaves `rel/x.db`; a query holds options.
    rest = uri[len(prefix) :].split("?", 1)[0]
    if rest in ("", ":memory:"):
        return None
    return Path(rest).absolute()


def local_artifact_location(uri: str) -> str | None:
    """`file://` URI of the artefact folder beside a local sqlite store (`<store dir>/mlartifacts`), for the
    experiments longhaul creates there; None for any other store (a server or a file store chooses its own).

    Without it MLflow puts a sqlite store's artefacts under `./mlruns` of whichever directory the process happens
    to run in, so a run directory would not hold its own artefacts and could not be moved or archived alone.
    """
    db = sqlite_store_path(uri)
    return None if db is None else (db.parent / MLFLOW_ARTIFACTS_SUBDIR).as_uri()


def build_ui_hint(uri: str, experiment_id: str = "") -> str:
    """How to look at an experiment's runs table in MLflow's UI, as one line for a terminal.

    A local sqlite store: the `mlflow ui` command with the store's absolute path (so it works from any
    directory), then the page to open. An HTTP(S) server: the page, without credentials. Anything else: the
    `mlflow ui` command with credentials redacted. Pages carry the query that makes MLflow's UI show its
    model-training navigation (`tags.UI_WORKFLOW_QUERY`), so they open on the runs, not the GenAI overview.
    """
    page = f"#/experiments/{experiment_id}/runs" if experiment_id else "#/experiments"
    page += f"?{T.UI_WORKFLOW_QUERY}"
    db = sqlite_store_path(uri)
    if db is not None:
        return f"mlflow ui --backend-store-uri {shlex.quote(f'sqlite:///{db}')}   then open {UI_DEFAULT_URL}/{page}"
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and parts.hostname:
        # Browsers ask for credentials themselves; a link must not carry them (nor a redacted stand-in).
        host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
        base = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
        return f"open {base}/{page}"
    return f"mlflow ui --backend-store-uri {shlex.quote(redact_uri(uri))}"


def _is_local_store(uri: str) -> bool:
    return uri.startswith(_LOCAL_SCHEMES) or "://" not in uri


def _local_path(uri: str) -> str:
    for scheme in ("sqlite:///", "file://", "sqlite:", "file:"):
        if uri.startswith(scheme):
            return uri[len(scheme) :] if scheme != "sqlite:///" else "/" + uri[len(scheme) :].lstrip("/")
    return uri


def resolve_tracking_uri(
    exp: Experiment,
    backend: Backend | str,
    run_dir: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    store: str | Path | None = None,
) -> str:
    """The MLflow tracking URI for this run on `backend` (rules in the module docstring).

    `environ` defaults to the process environment; `store` is a user-chosen local store (file or directory).
    Raises TrackingConfigError naming the field to set when nothing is configured for a cluster backend, or
    when the URI would point at a store that is lost with the container.
    """
    backend = Backend(backend)
    env = os.environ if environ is None else environ
    tracking = exp.spec.tracking
    from_env = (env.get(ENV_TRACKING_URI) or "").strip()
    if tracking.uri:
        uri, source = tracking.uri, "spec.tracking.uri"
    elif tracking.uri_secret is not None:
        if not from_env:
            sec = tracking.uri_secret
            raise TrackingConfigError(
                f"spec.tracking.uri_secret: the tracking URI should come from Secret '{sec.name}' key '{sec.key}' "
                f"as ${ENV_TRACKING_URI}, but that variable is not set in this environment; create the Secret "
                f"(kubectl create secret generic {sec.name} --from-literal={sec.key}=http://mlflow:5000) or set "
                "spec.tracking.uri instead"
            )
        uri, source = from_env, f"${ENV_TRACKING_URI} (from Secret {tracking.uri_secret.name})"
    elif from_env:
        uri, source = from_env, f"${ENV_TRACKING_URI}"
    elif backend == Backend.LOCAL:
        if store is not None:
            return local_store_uri(store)
        if run_dir is None:
            raise TrackingConfigError("local backend: no run directory given for the embedded MLflow store")
        group = seed_group(exp)
        # Seed runs of one Experiment share a store (the group's parent run and every seed's runs, so
        # `longhaul compare` sees them together): `<output_dir>/<group>/mlflow.db`, beside the seed run dirs.
        return local_store_uri(run_dir if group is None else Path(run_dir).absolute().parent / group)
    else:
        raise TrackingConfigError(
            f"spec.tracking: no MLflow tracking URI for backend '{backend}' (veRL would silently log to "
            f"{VERL_FALLBACK_URI}, which is lost with the job); set spec.tracking.uri "
            "(e.g. http://mlflow.example:5000), spec.tracking.uri_secret (Kubernetes), "
            f"or export {ENV_TRACKING_URI} before submitting (Slurm)"
        )
    if uri == VERL_FALLBACK_URI or (
        backend == Backend.KUBERNETES and _is_local_store(uri) and not _on_checkpoint_volume(exp, uri)
    ):
        raise TrackingConfigError(
            f"{source}: '{uri}' is a file inside the container and is lost when the pod ends; use an MLflow "
            "server URI (http://…), or a sqlite path under spec.backends.kubernetes.checkpoint_volume.mount_path"
        )
    return uri


def _on_checkpoint_volume(exp: Experiment, uri: str) -> bool:
    vol = exp.spec.backends.kubernetes.checkpoint_volume
    if vol is None:
        return False
    mount = vol.mount_path.rstrip("/") + "/"
    return _local_path(uri).startswith(mount)


def tracking_env(
    exp: Experiment,
    run_dir: str | Path | None,
    backend: Backend | str,
    *,
    run_id: str | None = None,
    environ: Mapping[str, str] | None = None,
    store: str | Path | None = None,
) -> dict[str, str]:
    """Environment variables for the trainer process (veRL's MLflow logger reads them).

    MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME (the spec family) and LONGHAUL_RUN_NAME always; MLFLOW_RUN_ID
    when the run was already created (`start_or_resume_run`), so veRL attaches to it instead of making one.
    """
    env = {
        ENV_TRACKING_URI: resolve_tracking_uri(exp, backend, run_dir, environ=environ, store=store),
        ENV_EXPERIMENT_NAME: experiment_family(exp),
        ENV_RUN_NAME: run_name(exp),
    }
    if run_id:
        env[ENV_RUN_ID] = run_id
    return env


def require_trainer_env(env: Mapping[str, str]) -> None:
    """Refuse to start veRL without an explicit tracking URI and run id (its fallback loses the data)."""
    missing = [k for k in (ENV_TRACKING_URI, ENV_RUN_ID) if not (env.get(k) or "").strip()]
    if missing:
        raise TrackingConfigError(
            f"refusing to start the trainer: {', '.join(missing)} not set (veRL would log to "
            f"{VERL_FALLBACK_URI} or open a second run); build the environment with "
            "longhaul.tracking.tracking_env(exp, run_dir, backend, run_id=...)"
        )
    if env[ENV_TRACKING_URI].strip() == VERL_FALLBACK_URI:
        raise TrackingConfigError(
            f"refusing to start the trainer: {ENV_TRACKING_URI} is veRL's temporary fallback {VERL_FALLBACK_URI}"
        )
