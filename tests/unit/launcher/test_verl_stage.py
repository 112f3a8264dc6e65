"""Before a veRL GRPO stage the launcher refuses a missing tracking target and writes veRL's inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from longhaul.launcher.stages import prepare_verl_inputs
from longhaul.render.plan import render_plan
from longhaul.spec import load_spec
from longhaul.tracking.config import TrackingConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_refuses_without_tracking_and_writes_nothing(tmp_path: Path) -> None:
    exp = load_spec(ROOT / "specs" / "lata.yaml")
    plan = render_plan(exp, "slurm", str(tmp_path / "run"))
    with pytest.raises(TrackingConfigError, match="MLFLOW_TRACKING_URI"):
        prepare_verl_inputs(exp, plan.paths, {}, print)
    assert not (tmp_path / "run").exists()
    with pytest.raises(TrackingConfigError, match="fallback"):
        prepare_verl_inputs(
            exp, plan.paths, {"MLFLOW_TRACKING_URI": "sqlite:////tmp/mlruns.db", "MLFLOW_RUN_ID": "x"}, print
        )


def test_writes_the_inputs_the_overrides_reference(tmp_path: Path) -> None:
    exp = load_spec(ROOT / "specs" / "lata.yaml")
    plan = render_plan(exp, "slurm", str(tmp_path / "run"))
    said: list[str] = []
    prepare_verl_inputs(
        exp, plan.paths, {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_RUN_ID": "abc"}, said.append
    )
    grpo = next(s for s in plan.stages if s.name == "grpo")
    for key in ("data.train_files=", "data.val_files=", "actor_rollout_ref.rollout.agent.agent_loop_config_path="):
        path = next(a for a in grpo.argv if a.startswith(key)).split("=", 1)[1].strip("'")
        assert Path(path).is_file(), path
    assert "train.parquet" in said[0]
