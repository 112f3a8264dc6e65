"""`spec.environment`: the τ² domain, its task split and the one horizon of training, validation and evaluation.

τ²'s tool-error budget (`TAU2_MAX_ERRORS`) is defined here, as the default of `max_tool_errors`; the episode
runner (`longhaul.envs.runner`) reads it from here too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import DOMAIN_TASKS, MAX_TOOL_CHARS, EpisodeEvents, Tokens, Turns
from longhaul.spec.strings import ONE_LINE_TEXT

#: τ²'s limit on tool errors per episode (tau2-bench a2c0247: `tau2.config.DEFAULT_MAX_ERRORS`, the default
#: `max_errors` of `tau2.orchestrator.orchestrator.Orchestrator`, of `RunConfig` and of `tau2 run --max-errors`).
TAU2_MAX_ERRORS = 10


class SplitPreset(StrEnum):
    SEED_40_10 = "seed_40_10"
    TAU2_OFFICIAL = "tau2_official"
    EXPLICIT = "explicit"


#: A task id of the (only) domain, airline: 0 … 49.
TaskId = Annotated[int, Field(ge=0, le=DOMAIN_TASKS["airline"] - 1)]


class SplitSpec(SpecModel):
    preset: SplitPreset = Field(
        default=SplitPreset.SEED_40_10,
        description="seed_40_10 (train 40 / test 10, covered_seen from the original teacher), "
        "tau2_official (τ²'s split file), or explicit (lists below).",
    )
    train: list[TaskId] | None = Field(default=None, description="explicit: train task ids.")
    test: list[TaskId] | None = Field(default=None, description="explicit: test task ids.")
    covered_seen: list[TaskId] | None = Field(
        default=None, description="explicit: train tasks covered by SFT data (optional)."
    )

    @model_validator(mode="after")
    def _explicit(self) -> SplitSpec:
        lists = {"train": self.train, "test": self.test, "covered_seen": self.covered_seen}
        if self.preset != SplitPreset.EXPLICIT:
            given = [k for k, v in lists.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply to preset 'explicit' (preset is '{self.preset}')")
            return self
        if not self.train or not self.test:
            raise FieldError(
                "train" if not self.train else "test", "preset 'explicit' needs non-empty `train` and `test` lists"
            )
        overlap = sorted(set(self.train) & set(self.test))
        if overlap:
            raise FieldError("test", f"train and test overlap on task ids {overlap}")
        for name, ids in lists.items():
            if ids is not None and len(set(ids)) != len(ids):
                raise FieldError(name, f"`{name}` has duplicate task ids")
        if self.covered_seen and not set(self.covered_seen) <= set(self.train):
            raise FieldError("covered_seen", "covered_seen must be a subset of train")
        return self


class EnvironmentSpec(SpecModel):
    """One horizon for training, validation and evaluation."""

    domain: Literal["airline"] = Field(default="airline", description="τ²-bench domain.")
    split: SplitSpec = Field(default_factory=SplitSpec, description="Task split.")
    max_turns: Turns = Field(default=30, description="Maximum assistant turns per episode.")
    max_tokens_per_turn: Tokens = Field(default=4096, description="Maximum generated tokens per assistant turn.")
    max_response_tokens: Tokens = Field(
        default=12288,
        description="Maximum tokens of the whole multi-turn response (assistant, tool and user tokens).",
    )
    max_prompt_tokens: Tokens = Field(
        default=8192, description="Maximum prompt tokens (system policy text, tool schemas, first user message)."
    )
    tool_output_limit: Annotated[int, Field(ge=1, le=MAX_TOOL_CHARS)] | None = Field(
        default=None, description="Maximum characters of a tool result shown to the policy; null = unlimited."
    )
    abort_repeated_calls: EpisodeEvents | None = Field(
        default=None,
        description="End the episode (reason 'loop') when the same call repeats this many times; null = never.",
    )
    transfer_ends_episode: bool = Field(
        default=False,
        description="τ-bench 1 semantics: a successful transfer_to_human_agents ends the episode (reason "
        "'transfer'). Default false = τ²: the transfer is an ordinary tool, the user simulator or the agent ends "
        "the episode, and later writes and messages count.",
    )
    max_tool_errors: EpisodeEvents | None = Field(
        default=TAU2_MAX_ERRORS,
        description="End the episode (reason 'too_many_errors', scored 0) once this many tool calls have returned "
        "an error, counted over the whole episode and checked after each assistant turn's calls; null = no limit. "
        "The default is τ²'s: tau2-bench a2c0247, tau2.config.DEFAULT_MAX_ERRORS, checked by "
        "Orchestrator._check_termination.",
    )
    date_line: str = Field(
        default="The current date is 2024-05-15 (Wednesday).",
        max_length=200,
        pattern=ONE_LINE_TEXT,
        description="Date grounding appended to the policy text in the system prompt.",
    )
