"""`spec.reward`: the outcome reward, the process reward added to it, and how credit reaches the tokens."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from longhaul.spec.base import SpecModel
from longhaul.spec.rules import RulesSpec


class ProcessReward(StrEnum):
    NONE = "none"
    PRM_LITE = "prm_lite"


class Credit(StrEnum):
    TRAJECTORY = "trajectory"
    TURN = "turn"


class RewardSpec(SpecModel):
    outcome: Literal["binary"] = Field(default="binary", description="Outcome reward: 1 if graded success.")
    process: ProcessReward = Field(default=ProcessReward.NONE, description="Process reward added to the outcome.")
    weight: float = Field(default=0.3, ge=0.0, le=10.0, description="reward = outcome + weight × process.")
    credit: Credit = Field(
        default=Credit.TRAJECTORY,
        description="trajectory: one scalar per episode (the original); turn: each assistant turn's own "
        "process score reaches that turn's tokens.",
    )
    rules: RulesSpec = Field(
        default_factory=RulesSpec,
        description="Per-rule overrides of PRM-Lite weights/thresholds by rule name, e.g. "
        "{placeholder: {write_weight: -0.1}, length_penalty: {enabled: false}}.",
    )
