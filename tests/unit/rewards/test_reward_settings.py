"""One reward function: the agent loop (training), `longhaul explain` and the estimator settings read the reward
through `RewardSettings`, built once from the spec; the process reward counts, with the spec's weight, exactly when
`reward.process` is prm_lite."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longhaul.rewards.combine import RewardBreakdown, RewardSettings, combine_reward
from longhaul.rewards.prm_lite import PrmLiteResult
from longhaul.spec.load import build_experiment

ROOT = Path(__file__).resolve().parents[3]


def _exp(process: str, weight: float = 0.3, credit: str = "trajectory"):
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["reward"] = {"process": process, "weight": weight, "credit": credit}
    return build_experiment(doc, "smoke.yaml")


@pytest.mark.parametrize("process", ["none", "prm_lite"])
def test_every_reader_gets_the_same_settings(process: str) -> None:
    from longhaul.agentloop.config import build_loop_settings
    from longhaul.algos.settings import settings_from_spec

    exp = _exp(process)
    rs = RewardSettings.from_spec(exp)
    assert build_loop_settings(exp)["reward"] == rs.to_dict()
    assert RewardSettings.from_dict(yaml.safe_load(yaml.safe_dump(rs.to_dict()))) == rs
    assert settings_from_spec(exp)["process_weight"] == rs.process_weight == (0.3 if process == "prm_lite" else 0.0)


def test_the_process_reward_counts_only_when_it_is_on() -> None:
    prm = PrmLiteResult(
        steps=(), trajectory_hits=(), mean_step_score=0.5, raw=0.5, process=0.5, turn_scores=(0.25, 0.25)
    )
    on, off = RewardSettings.from_spec(_exp("prm_lite")), RewardSettings.from_spec(_exp("none"))
    assert on.combine(1.0, prm) == combine_reward(1.0, prm, 0.3) == RewardBreakdown(1.15, 1.0, 0.5, 0.3, (0.075, 0.075))
    # explain scores PRM-Lite for display even when it is off; the reward stays the outcome
    assert off.combine(1.0, prm) == off.combine(1.0, None) == RewardBreakdown(1.0, 1.0, 0.0, 0.0, ())
