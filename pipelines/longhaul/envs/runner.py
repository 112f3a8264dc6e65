"""The one episode runner, used by evaluation (OpenAI-compatible endpoints) and by the veRL agent loop.

It builds the prompt (policy text + date line as the system message, the 14 tool schemas, the user simulator's
first message), runs assistant turns one at a time, executes tool calls in the environment, asks the user
simulator after every message to the user, applies the spec's limits, ends on the FIRST terminal event and grades
exactly once. As in τ², the episode ends when the user simulator or the agent stops it (or at a limit, which
scores 0); a transfer to a human agent ends it only under `EpisodeLimits.transfer_ends_episode` (τ-bench 1).
As in τ²'s orchestrator, `EpisodeLimits.max_tool_errors` error observations in an episode end it
(`too_many_errors`, scored 0), checked once the assistant turn's tool calls have all run.
Token-level details stay in the `Policy` adapter; the runner only sees messages and token counts.

Size: over 400 lines because one episode loop with its termination rules, kept together so they can be read against
τ²'s orchestrator.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from longhaul.chat.thinking import visible_text
from longhaul.envs.trajectory import TAU2_MAX_ERRORS, Termination, ToolCall, Trajectory, Turn

if TYPE_CHECKING:
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.tasks import AirlineTask

#: Markers that end a conversation when the user simulator (or the agent) says them (τ² user simulator).
STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
AGENT_STOP_MARKER = "###STOP###"


# ---------------------------------------------------------------------------------------------------------
# What a policy and a user simulator must provide


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


# ---------------------------------------------------------------------------------------------------------
# Limits: one definition for training, validation and evaluation


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


# ---------------------------------------------------------------------------------------------------------
# Prompt


SYSTEM_TEMPLATE = """<instructions>
You are a customer service agent. Help the user according to the <policy> below.
In each turn you either send a message to the user or make one tool call, never both.
Always follow the policy. Tool arguments must be valid JSON.
</instructions>
<policy>
{policy}
</policy>
{date_line}"""


def build_system_prompt(policy_text: str, date_line: str) -> str:
    """The system prompt: the domain policy text (never omitted, method.md h.1) plus the date grounding line."""
    return SYSTEM_TEMPLATE.format(policy=policy_text.strip(), date_line=date_line.strip()).rstrip() + "\n"


def tool_schemas() -> list[dict[str, Any]]:
    """OpenAI `tools` for the 14 airline agent tools (generated from the package's tool signatures)."""
    from longhaul.envs.airline.tools import tool_schemas as _schemas

    return _schemas()


def build_initial_messages(policy_text: str, date_line: str, first_user_message: str) -> list[dict[str, Any]]:
    """System prompt + the user simulator's first message (part of the prompt, never of the response)."""
    return [
        {"role": "system", "content": build_system_prompt(policy_text, date_line)},
        {"role": "user", "content": first_user_message},
    ]


def limit_tool_output(text: str, limit: int | None) -> str:
    """Cut a tool observation to at most `limit` characters, saying how much was cut."""
    if limit is None or len(text) <= limit:
        return text
    marker = f"...[truncated {len(text) - limit} chars]"
    if limit <= len(marker):
        return text[:limit]
    cut = len(text) - (limit - len(marker))
    marker = f"...[truncated {cut} chars]"
    return text[: limit - len(marker)] + marker


def is_user_stop(text: str) -> bool:
    return any(m in text for m in STOP_MARKERS)


# ---------------------------------------------------------------------------------------------------------
# The loop


MessageHook = Callable[[dict[str, Any]], Any]


async def _notify(hook: MessageHook | None, message: dict[str, Any]) -> None:
    if hook is None:
        return
    res = hook(message)
    if inspect.isawaitable(res):
        await res


def _call_key(call: ParsedCall) -> str:
    if call.arguments is not None:
        return call.name + "\x00" + json.dumps(call.arguments, sort_keys=True)
    return call.name + "\x00" + call.raw_arguments


async def run_episode(
    env_or_factory: AirlineEnv | Callable[[], AirlineEnv],
    task: AirlineTask,
    policy: Policy,
    user: UserSimulator,
    limits: EpisodeLimits,
    *,
    trial: int = 0,
    seed: int | None = None,
    on_message: MessageHook | None = None,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """Run one episode to its first terminal event and grade it once.

    `on_message(message)` (sync or async) is called for every message appended to the transcript, in order,
    starting with the system prompt and the first user message; adapters use it to track what was added by whom.
    A `PolicyEndpointError` of the policy or user simulator (an endpoint down after its retries) ends the episode
    with termination `endpoint_error`, no grade and the error in `metadata["endpoint_error"]` (its fault class in
    `metadata["endpoint_fault"]`): its fate is recorded,
    never turned into a zero reward. Any other exception propagates.
    """
    from longhaul.envs.airline.env import MessageAction, ToolAction

    is_factory = isinstance(env_or_factory, type) or not hasattr(env_or_factory, "reset")
    env = env_or_factory() if is_factory else env_or_factory
    env.reset(task, transfer_ends_episode=limits.transfer_ends_episode)
    tools = tool_schemas()

    conversation: list[dict[str, str]] = []
    messages: list[dict[str, Any]] = []
    turns: list[Turn] = []
    endpoint_error: PolicyEndpointError | None = None
    try:
        first = await user.reply(task, [])
    except PolicyEndpointError as exc:
        endpoint_error, first = exc, ""
    if endpoint_error is None:
        conversation.append({"role": "user", "content": first})
        messages = build_initial_messages(env.policy_text, limits.date_line, first)
        for m in messages:
            await _notify(on_message, m)

    call_counts: Counter[str] = Counter()
    tool_errors = 0
    first_prompt_tokens: int | None = None
    completion_total = 0
    termination: Termination | None = (
        Termination.ENDPOINT_ERROR
        if endpoint_error is not None
        else Termination.USER_STOP
        if is_user_stop(first)
        else None
    )
    response_tokens = 0

    async def append(msg: dict[str, Any]) -> None:
        messages.append(msg)
        await _notify(on_message, msg)

    while termination is None:
        if len(turns) >= limits.max_turns:
            termination = Termination.MAX_TURNS
            break
        max_tokens = limits.max_tokens_per_turn
        try:
            pt = await policy.next_turn(list(messages), tools, max_tokens)
        except ContextOverflowError:
            termination = Termination.CONTEXT_OVERFLOW
            break
        except PolicyEndpointError as exc:
            endpoint_error, termination = exc, Termination.ENDPOINT_ERROR
            break
        completion_total += pt.completion_tokens
        if pt.prompt_tokens is not None and first_prompt_tokens is None:
            first_prompt_tokens = pt.prompt_tokens
            if limits.max_prompt_tokens is not None and pt.prompt_tokens > limits.max_prompt_tokens:
                termination = Termination.CONTEXT_OVERFLOW
                break
        if pt.prompt_tokens is not None and first_prompt_tokens is not None:
            response_tokens = pt.prompt_tokens - first_prompt_tokens + pt.completion_tokens
        else:
            response_tokens = completion_total
        index = len(turns)

        if limits.max_response_tokens is not None and response_tokens >= limits.max_response_tokens:
            # The response budget ran out inside this turn: veRL would cut it here, so nothing of it is executed.
            turns.append(Turn(index, pt.content, [], False, pt.completion_tokens, pt.finish_reason))
            await append({"role": "assistant", "content": pt.content})
            termination = Termination.MAX_TOKENS
            break

        if pt.tool_calls:
            ids = [c.call_id or f"call_{index}_{i}" for i, c in enumerate(pt.tool_calls)]
            await append(
                {
                    "role": "assistant",
                    "content": pt.content,
                    "tool_calls": [
                        {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                        for cid, c in zip(ids, pt.tool_calls, strict=True)
                    ],
                }
            )
            env.note_assistant_text(visible_text(pt.content))
            done_calls: list[ToolCall] = []
            for cid, call in zip(ids, pt.tool_calls, strict=True):
                if termination is not None:
                    # A terminal event ended the episode mid-turn: later calls are not executed.
                    break
                res = env.step(ToolAction(call.name, call.arguments, call.raw_arguments, cid, call.parse_error))
                shown = limit_tool_output(res.observation, limits.tool_output_limit)
                done_calls.append(
                    ToolCall(
                        name=call.name,
                        arguments=call.arguments,
                        raw_arguments=call.raw_arguments,
                        call_id=cid,
                        result=shown,
                        is_error=res.is_error,
                        known_tool=res.known_tool,
                        parse_error=call.parse_error,
                    )
                )
                await append({"role": "tool", "tool_call_id": cid, "name": call.name, "content": shown})
                if res.is_error:
                    tool_errors += 1
                if res.done:
                    termination = Termination(res.termination or Termination.TRANSFER)
                    break
                call_counts[_call_key(call)] += 1
                if (
                    limits.abort_repeated_calls is not None
                    and call_counts[_call_key(call)] >= limits.abort_repeated_calls
                ):
                    termination = Termination.LOOP
            turns.append(Turn(index, pt.content, done_calls, False, pt.completion_tokens, pt.finish_reason))
            if termination is None and tool_error_limit_reached(tool_errors, limits.max_tool_errors):
                # τ²: checked after the whole turn's calls ran (a limit reached mid-turn lets the rest execute);
                # an earlier terminal event of the same turn (τ-bench 1 transfer, loop) stays the first one.
                termination = Termination.TOO_MANY_ERRORS
            continue

        # What the turn says to the user: a thinking policy's <think> block stays in the transcript (the policy's
        # context) but is never shown to the user simulator or graded as communicated.
        said = visible_text(pt.content)
        if not said.strip():
            turns.append(Turn(index, pt.content, [], False, pt.completion_tokens, pt.finish_reason))
            await append({"role": "assistant", "content": pt.content})
            termination = Termination.POLICY_FORMAT_ERROR
            break

        # A message to the user.
        turns.append(Turn(index, pt.content, [], True, pt.completion_tokens, pt.finish_reason))
        await append({"role": "assistant", "content": pt.content})
        res = env.step(MessageAction(said))
        conversation.append({"role": "assistant", "content": said})
        if res.done:
            termination = Termination(res.termination or Termination.AGENT_STOP)
            break
        try:
            reply = await user.reply(task, list(conversation))
        except PolicyEndpointError as exc:
            endpoint_error, termination = exc, Termination.ENDPOINT_ERROR
            break
        conversation.append({"role": "user", "content": reply})
        await append({"role": "user", "content": reply})
        if is_user_stop(reply):
            termination = Termination.USER_STOP

    env.terminate(termination)
    grade = None if endpoint_error is not None else env.grade()  # the harness cut it short: nothing to grade
    n_calls = sum(len(t.tool_calls) for t in turns)
    n_err = sum(1 for t in turns for c in t.tool_calls if c.is_error)
    meta: dict[str, Any] = {"response_tokens": response_tokens, "date_line": limits.date_line}
    if endpoint_error is not None:  # the client's message names the endpoint; `kind` is its fault class
        meta["endpoint_error"] = str(endpoint_error)
        meta["endpoint_fault"] = getattr(endpoint_error, "kind", None)
    meta.update(metadata or {})
    return Trajectory(
        task_id=str(task.id),
        trial=trial,
        seed=seed,
        messages=messages,
        turns=turns,
        termination=str(env.termination),
        grade=grade,
        num_tool_calls=n_calls,
        num_tool_errors=n_err,
        metadata=meta,
    )
