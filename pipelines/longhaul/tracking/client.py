"""The MLflow client basics every adapter module shares: the error type, a client for a URI or a client, the
clock MLflow stamps with, filter-string quoting and a run's terminal status."""

from __future__ import annotations

import contextlib
import sys
import time

from mlflow.tracking import MlflowClient


class TrackingError(RuntimeError):
    """An MLflow operation could not be completed; the message says which run and what to check."""


def client_for(tracking_uri: str | MlflowClient) -> MlflowClient:
    """An MlflowClient bound to `tracking_uri` (a client is passed through)."""
    if isinstance(tracking_uri, MlflowClient):
        return tracking_uri
    return MlflowClient(tracking_uri=tracking_uri)


def now_ms() -> int:
    return int(time.time() * 1000)


def quote_filter(value: str) -> str:
    """Quote a value for an MLflow filter string (single quotes doubled is not supported; refuse them)."""
    if "'" in value:
        raise TrackingError(f"cannot search MLflow for a value containing a quote: {value!r}")
    return f"'{value}'"


def terminate(client: MlflowClient, run_id: str, status: str) -> None:
    """Set a run's terminal status now (MLflow's "View run" links go to stderr, not stdout)."""
    with contextlib.redirect_stdout(sys.stderr):
        client.set_terminated(run_id, status=status)
