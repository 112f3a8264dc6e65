"""Shared fixtures of the MLflow e2e tests: one real server and one set of ablation runs per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.mlflow_server import MlflowServer, mlflow_server  # noqa: F401  (session fixture)
from support.tracking_runs import PopulatedRun, populate_ablation_runs


@pytest.fixture(scope="session")
def ablation_runs(mlflow_server: MlflowServer, tmp_path_factory: pytest.TempPathFactory) -> list[PopulatedRun]:  # noqa: F811
    """vanilla, lata and prm_lite_lata runs: veRL-logged training metrics, checkpoints, 3 evaluated checkpoints."""
    return populate_ablation_runs(mlflow_server.uri, Path(tmp_path_factory.mktemp("runs")))
