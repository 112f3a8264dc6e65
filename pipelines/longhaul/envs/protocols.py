"""What the episode runner needs from a policy and a user simulator, and the errors their backends raise.

The runner (`longhaul.envs.runner`) sees messages and token counts only; the adapters in `longhaul.clients` (OpenAI
-compatible endpoints) and `longhaul.agentloop` (veRL's rollout server) implement `Policy` and `UserSimulator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class ParsedCall:
    """A tool call as the policy produced it. `arguments` is None when `raw_arguments` is not a JSON object;
    `parse_error` then says why (the call becomes an error observation for that turn)."""

    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str
    parse_error: str | None = None
    call_id: str | None = None  # the server's id, if it gave one; the runner makes one otherwise


@dataclass(frozen=True)
class PolicyTurn:
    """One assistant turn from a policy."""

    content: str
    tool_calls: list[ParsedCall] = field(default_factory=list)
    completion_tokens: int = 0
    finish_reason: str | None = None
    #: Tokens of the prompt this turn was generated from, if the backend reports them (OpenAI `usage`, veRL).
    #: With it the runner counts the whole multi-turn response (assistant + tool + user tokens) exactly as
    #: veRL does; without it only completion tokens count towards max_response_tokens.
    prompt_tokens: int | None = None
    #: The policy weights versions (first, last) this turn was generated with, if the backend reports them
    #: (veRL's rollout: the trainer step of the weights). An asynchronous trainer can abort a generation at a
    #: weight update and resume it with the new weights: such a turn spans two versions.
    policy_version: tuple[int, int] | None = None


@runtime_checkable
class Policy(Protocol):
    """The agent being evaluated or trained."""

    async def next_turn(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int
    ) -> PolicyTurn:
        """Return the next assistant turn for the full OpenAI-format message list."""
        ...


@runtime_checkable
class UserSimulator(Protocol):
    """The simulated customer. `conversation` holds the text messages so far from the AGENT's point of view
    (`assistant` = agent, `user` = the simulated user); the first call gets `[]` and returns the opening
    message. A reply containing `###STOP###` ends the episode."""

    async def reply(self, task: Any, conversation: list[dict[str, str]]) -> str: ...


class ContextOverflowError(RuntimeError):
    """Raised by a Policy when the backend refuses the prompt as longer than its context window. The runner
    ends the episode with termination 'context_overflow' (a premature end that scores 0)."""


class PolicyEndpointError(RuntimeError):
    """A policy or user-simulator backend failed after its retries. The runner ends the episode with termination
    `endpoint_error` and no grade (never a zero reward); the evaluation records it as unscored and stops once too
    many episodes end that way (`longhaul.eval.evaluate`)."""
