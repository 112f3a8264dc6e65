"""The horizon of one episode: one definition for training, validation and evaluation (spec.environment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longhaul.spec.environment import TAU2_MAX_ERRORS


def tool_error_limit_reached(num_tool_errors: int, limit: int | None) -> bool:
    """τ²'s `too_many_errors` rule. τ²'s orchestrator counts every tool result with `error=True` over the whole
    episode (`_execute_tool_calls`: an exception raised by the tool, e.g. an unknown tool, an unexpected or missing
    argument, a wrong-typed value, a record not found, a refused write; never reset) and, once ALL calls of the
    assistant's message have run, ends the simulation when `num_errors >= max_errors` (`_check_termination`),
    before the agent speaks again. evaluate_simulation scores that termination 0. longhaul counts every error
    observation, including a call whose arguments were not a JSON object (τ²'s LLM client raises on those instead
    of executing anything)."""
    return limit is not None and num_tool_errors >= limit


@dataclass(frozen=True)
class EpisodeLimits:
    """The horizon of one episode (spec.environment)."""

    max_turns: int = 30
    max_tokens_per_turn: int = 4096
    max_response_tokens: int | None = None
    max_prompt_tokens: int | None = None
    tool_output_limit: int | None = None
    abort_repeated_calls: int | None = None
    date_line: str = ""
    #: τ-bench 1's rule: a successful `transfer_to_human_agents` ends the episode. Default: τ²'s, where the
    #: transfer is an ordinary tool and the user simulator (`###TRANSFER###`) or the agent ends the episode.
    transfer_ends_episode: bool = False
    #: End the episode as `too_many_errors` (scored 0) once this many tool calls of the episode have returned an
    #: error observation; None = no limit. The default is τ²'s (`TAU2_MAX_ERRORS`); see `tool_error_limit_reached`.
    max_tool_errors: int | None = TAU2_MAX_ERRORS

    @classmethod
    def from_spec(cls, exp: Any) -> EpisodeLimits:
        """Limits from an `Experiment` (or an `ExperimentSpec` / `EnvironmentSpec`)."""
        env = exp
        for attr in ("spec", "environment"):
            if hasattr(env, attr):
                env = getattr(env, attr)
        return cls(
            max_turns=env.max_turns,
            max_tokens_per_turn=env.max_tokens_per_turn,
            max_response_tokens=env.max_response_tokens,
            max_prompt_tokens=env.max_prompt_tokens,
            tool_output_limit=env.tool_output_limit,
            abort_repeated_calls=env.abort_repeated_calls,
            date_line=env.date_line,
            transfer_ends_episode=env.transfer_ends_episode,
            max_tool_errors=env.max_tool_errors,
        )
