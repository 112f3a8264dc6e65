"""`spec.sft`: the SFT warm start, on trajectories a teacher collects (best of N per training task) or a given set."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import Batch, Epochs, Samples, Tokens
from longhaul.spec.paths import SafePath
from longhaul.spec.serving import ModelRef
from longhaul.spec.strings import Url


class TeacherSpec(SpecModel):
    model: ModelRef = Field(
        default_factory=lambda: ModelRef(name="Qwen/Qwen2.5-72B-Instruct-AWQ"), description="Teacher policy."
    )
    url: Url | None = Field(default=None, description="Teacher endpoint; null = the simulator server.")
    samples_per_task: Samples = Field(default=16, description="Best-of-N attempts per training task.")
    temperatures: list[Annotated[float, Field(ge=0.0, le=2.0)]] = Field(
        default_factory=lambda: [0.0] * 4 + [0.5] * 4 + [0.8] * 4 + [1.0] * 4,
        description="Temperature schedule, one per attempt (length = samples_per_task).",
    )
    max_tokens: Tokens = Field(default=768, description="Teacher tokens per turn.")

    @model_validator(mode="after")
    def _schedule(self) -> TeacherSpec:
        if len(self.temperatures) != self.samples_per_task:
            raise FieldError(
                "temperatures",
                f"temperatures has {len(self.temperatures)} entries but samples_per_task is {self.samples_per_task}",
            )
        return self


class SFTSpec(SpecModel):
    teacher: TeacherSpec = Field(default_factory=TeacherSpec, description="Trajectory collection.")
    dataset: SafePath | None = Field(default=None, description="Use an existing trajectories JSONL; skip collection.")
    learning_rate: float = Field(default=1e-4, gt=0.0, lt=1.0, description="SFT learning rate.")
    epochs: Epochs = Field(default=5, description="SFT epochs.")
    max_length: Tokens = Field(default=10240, description="Samples longer than this are dropped (never cut).")
    batch_size: Batch = Field(default=8, description="Global batch size.")
    micro_batch_size_per_gpu: Batch = Field(default=2, description="Micro batch per GPU.")
    min_label_tokens: Tokens = Field(default=5, description="Drop samples with fewer label tokens.")
