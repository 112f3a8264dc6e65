"""Tracking URI rules and the trainer environment (no MLflow needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longhaul.spec import build_experiment, run_name
from longhaul.tracking.config import (
    VERL_FALLBACK_URI,
    TrackingConfigError,
    local_store_uri,
    require_trainer_env,
    resolve_tracking_uri,
    tracking_env,
)

CPU = {"resources": {"gpus_per_node": 0}, "policy": {"lora": {"rank": 0}}}


def exp(tracking: dict | None = None, **spec):
    return build_experiment({
        "apiVersion": "longhaul.dev/v1alpha1", "kind": "Experiment", "metadata": {"name": "abl"},
        "spec": {**CPU, **spec, **({"tracking": tracking} if tracking else {})},
    })  # fmt: skip


@pytest.mark.parametrize("backend", ["local", "slurm", "kubernetes"])
def test_spec_uri_wins_everywhere(backend):
    e = exp({"uri": "http://mlflow.internal:5000"})
    assert resolve_tracking_uri(e, backend, "/runs/x", environ={"MLFLOW_TRACKING_URI": "http://other"}) == (
        "http://mlflow.internal:5000"
    )


def test_secret_reference_reads_the_injected_variable():
    e = exp({"uri_secret": {"name": "mlflow", "key": "tracking-uri"}})
    assert (
        resolve_tracking_uri(e, "kubernetes", None, environ={"MLFLOW_TRACKING_URI": "http://m:5000"}) == "http://m:5000"
    )
    with pytest.raises(TrackingConfigError) as err:
        resolve_tracking_uri(e, "kubernetes", None, environ={})
    msg = str(err.value)
    assert (
        "spec.tracking.uri_secret" in msg
        and "'mlflow'" in msg
        and "'tracking-uri'" in msg
        and "MLFLOW_TRACKING_URI" in msg
    )


def test_local_default_is_sqlite_under_the_run_dir(tmp_path):
    e = exp()
    assert resolve_tracking_uri(e, "local", tmp_path, environ={}) == f"sqlite:///{tmp_path}/mlflow.db"
    assert resolve_tracking_uri(e, "local", tmp_path, environ={}, store=tmp_path / "mine.db") == (
        f"sqlite:///{tmp_path}/mine.db"
    )
    assert resolve_tracking_uri(e, "local", tmp_path, environ={}, store=tmp_path / "dir") == (
        f"sqlite:///{tmp_path}/dir/mlflow.db"
    )
    # A user's exported URI beats the embedded default.
    assert resolve_tracking_uri(e, "local", tmp_path, environ={"MLFLOW_TRACKING_URI": "http://h:1"}) == "http://h:1"


def test_local_store_uri_is_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert local_store_uri("runs/a") == f"sqlite:///{tmp_path}/runs/a/mlflow.db"


@pytest.mark.parametrize("backend", ["slurm", "kubernetes"])
def test_cluster_backends_refuse_without_a_uri(backend):
    with pytest.raises(TrackingConfigError) as err:
        resolve_tracking_uri(exp(), backend, "/runs/x", environ={})
    msg = str(err.value)
    assert f"backend '{backend}'" in msg and "spec.tracking.uri" in msg and VERL_FALLBACK_URI in msg


def test_slurm_takes_an_exported_uri():
    assert resolve_tracking_uri(exp(), "slurm", "/runs/x", environ={"MLFLOW_TRACKING_URI": "http://h:5000"}) == (
        "http://h:5000"
    )


def test_verl_fallback_and_pod_local_files_are_refused():
    with pytest.raises(TrackingConfigError, match="lost"):
        resolve_tracking_uri(exp(), "slurm", None, environ={"MLFLOW_TRACKING_URI": VERL_FALLBACK_URI})
    with pytest.raises(TrackingConfigError, match="checkpoint_volume"):
        resolve_tracking_uri(exp({"uri": "sqlite:////tmp/x.db"}), "kubernetes", None, environ={})
    on_volume = exp(
        {"uri": "sqlite:////checkpoints/mlflow.db"},
        backends={"kubernetes": {"checkpoint_volume": {"claim_name": "ckpt"}}},
    )
    assert resolve_tracking_uri(on_volume, "kubernetes", None, environ={}) == "sqlite:////checkpoints/mlflow.db"


def test_tracking_env_and_trainer_guard(tmp_path: Path):
    e = exp()
    env = tracking_env(e, tmp_path, "local", environ={})
    assert env == {
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "MLFLOW_EXPERIMENT_NAME": "longhaul/abl",
        "LONGHAUL_RUN_NAME": run_name(e),
    }
    with pytest.raises(TrackingConfigError, match="MLFLOW_RUN_ID"):
        require_trainer_env(env)
    require_trainer_env(tracking_env(e, tmp_path, "local", environ={}, run_id="abc"))
    with pytest.raises(TrackingConfigError, match="MLFLOW_TRACKING_URI"):
        require_trainer_env({"MLFLOW_RUN_ID": "abc"})
    with pytest.raises(TrackingConfigError, match="fallback"):
        require_trainer_env({"MLFLOW_RUN_ID": "abc", "MLFLOW_TRACKING_URI": VERL_FALLBACK_URI})


def test_experiment_override():
    e = exp({"experiment": "team-ablations"})
    assert tracking_env(e, "/r", "local", environ={})["MLFLOW_EXPERIMENT_NAME"] == "team-ablations"
