"""What one episode leaves behind: tool calls, assistant turns, the grade and the whole trajectory.

Plain frozen dataclasses with an exact JSON round trip (`to_dict` / `from_dict`), shared by the episode runner,
evaluation (per-trial JSONL records), the process reward (PRM-Lite reads `Turn.tool_calls`) and the veRL agent
loop. No I/O here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Termination(StrEnum):
    """Why an episode ended. Only `user_stop`, `agent_stop` and `transfer` are normal ends that get graded on
    their merits; every other reason is a premature termination and scores 0 (τ² semantics). `transfer` occurs
    only with `transfer_ends_episode` (τ-bench 1); in τ² a transfer is an ordinary tool call."""

    USER_STOP = "user_stop"  # the user simulator said ###STOP### (or ###TRANSFER### / ###OUT-OF-SCOPE###)
    AGENT_STOP = "agent_stop"  # the policy said ###STOP###
    TRANSFER = "transfer"  # transfer_to_human_agents succeeded under transfer_ends_episode (τ-bench 1 only)
    MAX_TURNS = "max_turns"  # spec.environment.max_turns assistant turns without an end
    MAX_TOKENS = "max_tokens"  # spec.environment.max_response_tokens reached
    LOOP = "loop"  # the same call repeated spec.environment.abort_repeated_calls times
    CONTEXT_OVERFLOW = "context_overflow"  # the policy server refused the prompt as too long
    POLICY_FORMAT_ERROR = "policy_format_error"  # the policy produced neither text nor a tool call
    TOO_MANY_ERRORS = "too_many_errors"  # spec.environment.max_tool_errors error observations (τ²'s max_errors)
    # The policy or user-simulator endpoint failed past its retries: the episode was cut short by the harness, not
    # by the agent, so it is never graded (grade None) and never counted as a failure (`scored` is false).
    ENDPOINT_ERROR = "endpoint_error"


#: Terminations that are graded on their merits; all others score 0.
NORMAL_TERMINATIONS = frozenset({Termination.USER_STOP, Termination.AGENT_STOP, Termination.TRANSFER})


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant turn and what the environment answered."""

    name: str
    arguments: dict[str, Any] | None  # None when `raw_arguments` is not a JSON object
    raw_arguments: str  # exactly what the policy produced
    call_id: str
    result: str | None = None  # the observation shown to the policy (after tool_output_limit)
    is_error: bool = False  # the observation is an error (unknown tool, bad JSON, bad arguments, tool raised)
    known_tool: bool = True  # False for hallucinated tool names (counted, method.md h.16)
    parse_error: str | None = None  # why raw_arguments could not be parsed, if it could not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(**d)


@dataclass(frozen=True)
class Turn:
    """One assistant turn: text, tool calls (executed in order), token count and finish reason."""

    index: int
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    to_user: bool = False  # a message to the user (no tool call)
    completion_tokens: int = 0
    finish_reason: str | None = None
    #: (first, last) policy weights version of the turn's generation, when the policy reports it (`PolicyTurn`).
    policy_version: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "index": self.index,
            "content": self.content,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "to_user": self.to_user,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
        }
        if self.policy_version is not None:  # training traces; evaluation records keep their keys
            d["policy_version"] = list(self.policy_version)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        d = dict(d)
        d["tool_calls"] = [ToolCall.from_dict(c) for c in d.get("tool_calls", [])]
        if d.get("policy_version") is not None:
            d["policy_version"] = tuple(d["policy_version"])
        return cls(**d)


@dataclass(frozen=True)
class Grade:
    """The outcome of one episode, computed exactly once (τ² airline: DB match × required info communicated)."""

    success: bool
    reward: float
    db_match: bool
    communicated: bool
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grade:
        return cls(**d)


@dataclass(frozen=True)
class Trajectory:
    """A whole episode. `messages` is the OpenAI chat transcript (system prompt and first user message
    included) exactly as the policy saw it."""

    task_id: str
    trial: int
    seed: int | None
    messages: list[dict[str, Any]]
    turns: list[Turn]
    termination: str
    grade: Grade | None
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> float:
        """Binary outcome: 1.0 if graded a success, else 0.0."""
        return 1.0 if self.grade is not None and self.grade.success else 0.0

    @property
    def aborted(self) -> bool:
        """True when the episode ended prematurely (limit, loop, overflow, format error, too many tool errors)."""
        return self.termination not in {t.value for t in NORMAL_TERMINATIONS}

    @property
    def scored(self) -> bool:
        """False when the harness, not the agent, ended the episode (an endpoint down past its retries): such an
        episode has no outcome and is left out of every rate (`longhaul.eval.metrics`)."""
        return self.termination != Termination.ENDPOINT_ERROR

    @property
    def num_unknown_tool_calls(self) -> int:
        return sum(1 for t in self.turns for c in t.tool_calls if not c.known_tool)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "trial": self.trial,
            "seed": self.seed,
            "messages": self.messages,
            "turns": [t.to_dict() for t in self.turns],
            "termination": str(self.termination),
            "grade": self.grade.to_dict() if self.grade is not None else None,
            "num_tool_calls": self.num_tool_calls,
            "num_tool_errors": self.num_tool_errors,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        return cls(
            task_id=str(d["task_id"]),
            trial=int(d["trial"]),
            seed=d.get("seed"),
            messages=list(d["messages"]),
            turns=[Turn.from_dict(t) for t in d.get("turns", [])],
            termination=str(d["termination"]),
            grade=Grade.from_dict(d["grade"]) if d.get("grade") is not None else None,
            num_tool_calls=int(d.get("num_tool_calls", 0)),
            num_tool_errors=int(d.get("num_tool_errors", 0)),
            metadata=dict(d.get("metadata", {})),
        )
