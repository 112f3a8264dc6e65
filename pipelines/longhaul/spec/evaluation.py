"""`spec.evaluation`: pass^k evaluation of chosen checkpoints, and the subset that selects the best one."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import MAX_BOOTSTRAP, Concurrency, RandomSeed, Samples, Step
from longhaul.spec.seeds import MAX_SEEDS


class SubsetName(StrEnum):
    TRAIN = "train"
    TEST = "test"
    COVERED_SEEN = "covered_seen"
    UNCOVERED_SEEN = "uncovered_seen"
    UNSEEN = "unseen"


class EvaluationSpec(SpecModel):
    checkpoints: list[Step] | Literal["all", "last"] = Field(
        default="all", description="Training steps to evaluate (0 = initial policy), 'all' saved, or 'last'."
    )
    samples_per_task: Samples = Field(default=8, description="Trials per task (n ≥ max k).")
    k: list[Samples] = Field(default_factory=lambda: [1, 2, 4], description="k values for pass^k and pass@k.")
    seeds: list[RandomSeed] = Field(
        default_factory=lambda: [0], min_length=1, max_length=MAX_SEEDS, description="Evaluation seeds."
    )
    select_on: SubsetName = Field(
        default=SubsetName.TRAIN, description="Subset that selects the best checkpoint (never 'test')."
    )
    bootstrap_samples: int = Field(default=1000, ge=1, le=MAX_BOOTSTRAP, description="Bootstrap resamples for CIs.")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="CI level.")
    concurrency: Concurrency = Field(default=32, description="Episodes in flight.")

    @model_validator(mode="after")
    def _k(self) -> EvaluationSpec:
        if max(self.k, default=1) > self.samples_per_task:
            raise FieldError(
                "samples_per_task", f"samples_per_task ({self.samples_per_task}) must be ≥ max k ({max(self.k)})"
            )
        if self.select_on in (SubsetName.TEST, SubsetName.UNSEEN):
            raise FieldError(
                "select_on",
                f"select_on must not be '{self.select_on}': it holds the test tasks (unseen is the "
                "test split in every preset), and selecting on the reported subset biases it; use train, "
                "covered_seen or uncovered_seen",
            )
        return self
