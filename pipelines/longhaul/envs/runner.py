"""The one episode runner, used by evaluation (OpenAI-compatible endpoints) and by the veRL agent loop.

It builds the prompt (policy text + date line as the system message, the 14 tool schemas, the user simulator's
first message), runs assistant turns one at a time, executes tool calls in the environment, asks the user
simulator after every message to the user, applies the spec's limits, ends on the FIRST terminal event and grades
exactly once. As in τ², the episode ends when the user simulator or the agent stops it (or at a limit, which
scores 0); a transfer to a human agent ends it only under `EpisodeLimits.transfer_ends_episode` (τ-bench 1).
As in τ²'s orchestrator, `EpisodeLimits.max_tool_errors` error observations in an episode end it
(`too_many_errors`, scored 0), checked once the assistant turn's tool calls have all run.
Token-level details stay in the `Policy` adapter; the runner only sees messages and token counts.

What a policy and a user simulator provide is in `longhaul.envs.protocols`, the limits in `longhaul.envs.limits`,
the prompt and the stop markers in `longhaul.envs.prompt`; the termination rules are all here, in the order
they apply, so they can be read against τ²'s orchestrator.
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from longhaul.chat.thinking import visible_text
from longhaul.envs.airline.env import AirlineEnv, MessageAction, ToolAction
from longhaul.envs.airline.tasks import AirlineTask
from longhaul.envs.limits import EpisodeLimits, tool_error_limit_reached
from longhaul.envs.prompt import build_initial_messages, is_user_stop, limit_tool_output, tool_schemas
from longhaul.envs.protocols import (
    ContextOverflowError,
    ParsedCall,
    Policy,
    PolicyEndpointError,
    PolicyTurn,
    UserSimulator,
)
from longhaul.envs.trajectory import Termination, ToolCall, Trajectory, Turn

MessageHook = Callable[[dict[str, Any]], Any]


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
    is_factory = isinstance(env_or_factory, type) or not hasattr(env_or_factory, "reset")
    env = env_or_factory() if is_factory else env_or_factory
    env.reset(task, transfer_ends_episode=limits.transfer_ends_episode)
    tools = tool_schemas()
    ep = _Episode(env, task, limits, on_message)
    await _open_conversation(ep, user)
    while ep.termination is None:
        await _take_turn(ep, policy, user, tools)
    env.terminate(ep.termination)
    return _trajectory(ep, trial, seed, metadata)


@dataclass
class _Episode:
    """One running episode: the transcript, the turns and the counters the limits read. `termination` is set by
    the first terminal event and ends the loop."""

    env: AirlineEnv
    task: AirlineTask
    limits: EpisodeLimits
    on_message: MessageHook | None
    conversation: list[dict[str, str]] = field(default_factory=list)  # the user simulator's view: text only
    messages: list[dict[str, Any]] = field(default_factory=list)  # the policy's transcript
    turns: list[Turn] = field(default_factory=list)
    call_counts: Counter[str] = field(default_factory=Counter)
    tool_errors: int = 0
    first_prompt_tokens: int | None = None
    completion_total: int = 0
    response_tokens: int = 0
    termination: Termination | None = None
    endpoint_error: PolicyEndpointError | None = None

    async def append(self, message: dict[str, Any]) -> None:
        """Add `message` to the transcript and tell the hook."""
        self.messages.append(message)
        await _notify(self.on_message, message)

    async def end_turn_unexecuted(self, index: int, pt: PolicyTurn, termination: Termination) -> None:
        """Record an assistant turn that is not acted on and end the episode with `termination`."""
        self.turns.append(turn_of(index, pt, [], to_user=False))
        await self.append({"role": "assistant", "content": pt.content})
        self.termination = termination


def turn_of(index: int, pt: PolicyTurn, calls: list[ToolCall], *, to_user: bool) -> Turn:
    """The trajectory's record of the policy's turn `pt`, with the tool calls that were executed."""
    return Turn(index, pt.content, calls, to_user, pt.completion_tokens, pt.finish_reason, pt.policy_version)


async def _notify(hook: MessageHook | None, message: dict[str, Any]) -> None:
    if hook is None:
        return
    res = hook(message)
    if inspect.isawaitable(res):
        await res


async def _open_conversation(ep: _Episode, user: UserSimulator) -> None:
    """The user simulator's first message opens the transcript (system prompt + that message); a first message
    that already stops, or a simulator endpoint that is down, ends the episode before any turn."""
    try:
        first = await user.reply(ep.task, [])
    except PolicyEndpointError as exc:
        ep.endpoint_error, ep.termination = exc, Termination.ENDPOINT_ERROR
        return
    ep.conversation.append({"role": "user", "content": first})
    ep.messages = build_initial_messages(ep.env.policy_text, ep.limits.date_line, first)
    for m in ep.messages:
        await _notify(ep.on_message, m)
    if is_user_stop(first):
        ep.termination = Termination.USER_STOP


async def _take_turn(ep: _Episode, policy: Policy, user: UserSimulator, tools: list[dict[str, Any]]) -> None:
    """One assistant turn and what it leads to, the limits checked in τ²'s order: the turn budget, the policy's
    answer (or its context overflow), the token budgets, then the turn's tool calls or its message to the user."""
    limits = ep.limits
    if len(ep.turns) >= limits.max_turns:
        ep.termination = Termination.MAX_TURNS
        return
    try:
        pt = await policy.next_turn(list(ep.messages), tools, limits.max_tokens_per_turn)
    except ContextOverflowError:
        ep.termination = Termination.CONTEXT_OVERFLOW
        return
    except PolicyEndpointError as exc:
        ep.endpoint_error, ep.termination = exc, Termination.ENDPOINT_ERROR
        return
    if not _count_tokens(ep, pt):
        ep.termination = Termination.CONTEXT_OVERFLOW
        return
    index = len(ep.turns)
    if limits.max_response_tokens is not None and ep.response_tokens >= limits.max_response_tokens:
        # The response budget ran out inside this turn: veRL would cut it here, so nothing of it is executed.
        await ep.end_turn_unexecuted(index, pt, Termination.MAX_TOKENS)
        return
    if pt.tool_calls:
        await _run_tool_calls(ep, pt, index)
        return
    # What the turn says to the user: a thinking policy's <think> block stays in the transcript (the policy's
    # context) but is never shown to the user simulator or graded as communicated.
    said = visible_text(pt.content)
    if not said.strip():
        await ep.end_turn_unexecuted(index, pt, Termination.POLICY_FORMAT_ERROR)
        return
    await _message_user(ep, user, pt, index, said)


def _count_tokens(ep: _Episode, pt: PolicyTurn) -> bool:
    """Update the response's token count with `pt`; False when the first prompt is over `max_prompt_tokens`.

    With the backend's prompt tokens the response is everything after the first prompt (assistant, tool and user
    tokens, as veRL counts it); without them only the completion tokens count."""
    ep.completion_total += pt.completion_tokens
    if pt.prompt_tokens is not None and ep.first_prompt_tokens is None:
        ep.first_prompt_tokens = pt.prompt_tokens
        if ep.limits.max_prompt_tokens is not None and pt.prompt_tokens > ep.limits.max_prompt_tokens:
            return False
    if pt.prompt_tokens is not None and ep.first_prompt_tokens is not None:
        ep.response_tokens = pt.prompt_tokens - ep.first_prompt_tokens + pt.completion_tokens
    else:
        ep.response_tokens = ep.completion_total
    return True


async def _run_tool_calls(ep: _Episode, pt: PolicyTurn, index: int) -> None:
    """Execute the turn's tool calls in order until a terminal event, then apply τ²'s error limit."""
    ids = [c.call_id or f"call_{index}_{i}" for i, c in enumerate(pt.tool_calls)]
    await ep.append(
        {
            "role": "assistant",
            "content": pt.content,
            "tool_calls": [
                {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                for cid, c in zip(ids, pt.tool_calls, strict=True)
            ],
        }
    )
    ep.env.note_assistant_text(visible_text(pt.content))
    done_calls: list[ToolCall] = []
    for cid, call in zip(ids, pt.tool_calls, strict=True):
        if ep.termination is not None:
            # A terminal event ended the episode mid-turn: later calls are not executed.
            break
        done_calls.append(await _run_tool_call(ep, cid, call))
    ep.turns.append(turn_of(index, pt, done_calls, to_user=False))
    if ep.termination is None and tool_error_limit_reached(ep.tool_errors, ep.limits.max_tool_errors):
        # τ²: checked after the whole turn's calls ran (a limit reached mid-turn lets the rest execute);
        # an earlier terminal event of the same turn (τ-bench 1 transfer, loop) stays the first one.
        ep.termination = Termination.TOO_MANY_ERRORS


async def _run_tool_call(ep: _Episode, cid: str, call: ParsedCall) -> ToolCall:
    """One tool call: its observation (cut to `tool_output_limit`) joins the transcript; a terminal tool ends the
    episode, and so does the same call repeated `abort_repeated_calls` times."""
    res = ep.env.step(ToolAction(call.name, call.arguments, call.raw_arguments, cid, call.parse_error))
    shown = limit_tool_output(res.observation, ep.limits.tool_output_limit)
    done = ToolCall(
        name=call.name,
        arguments=call.arguments,
        raw_arguments=call.raw_arguments,
        call_id=cid,
        result=shown,
        is_error=res.is_error,
        known_tool=res.known_tool,
        parse_error=call.parse_error,
    )
    await ep.append({"role": "tool", "tool_call_id": cid, "name": call.name, "content": shown})
    if res.is_error:
        ep.tool_errors += 1
    if res.done:
        ep.termination = Termination(res.termination or Termination.TRANSFER)
        return done
    key = _call_key(call)
    ep.call_counts[key] += 1
    if ep.limits.abort_repeated_calls is not None and ep.call_counts[key] >= ep.limits.abort_repeated_calls:
        ep.termination = Termination.LOOP
    return done


def _call_key(call: ParsedCall) -> str:
    if call.arguments is not None:
        return call.name + "\x00" + json.dumps(call.arguments, sort_keys=True)
    return call.name + "\x00" + call.raw_arguments


async def _message_user(ep: _Episode, user: UserSimulator, pt: PolicyTurn, index: int, said: str) -> None:
    """A message to the user: the environment sees it (the agent may stop), then the user simulator replies."""
    ep.turns.append(turn_of(index, pt, [], to_user=True))
    await ep.append({"role": "assistant", "content": pt.content})
    res = ep.env.step(MessageAction(said))
    ep.conversation.append({"role": "assistant", "content": said})
    if res.done:
        ep.termination = Termination(res.termination or Termination.AGENT_STOP)
        return
    try:
        reply = await user.reply(ep.task, list(ep.conversation))
    except PolicyEndpointError as exc:
        ep.endpoint_error, ep.termination = exc, Termination.ENDPOINT_ERROR
        return
    ep.conversation.append({"role": "user", "content": reply})
    await ep.append({"role": "user", "content": reply})
    if is_user_stop(reply):
        ep.termination = Termination.USER_STOP


def _trajectory(ep: _Episode, trial: int, seed: int | None, metadata: dict[str, Any] | None) -> Trajectory:
    """Grade the ended episode once (not when the harness cut it short) and record it."""
    env, turns = ep.env, ep.turns
    grade = None if ep.endpoint_error is not None else env.grade()  # the harness cut it short: nothing to grade
    n_calls = sum(len(t.tool_calls) for t in turns)
    n_err = sum(1 for t in turns for c in t.tool_calls if c.is_error)
    meta: dict[str, Any] = {"response_tokens": ep.response_tokens, "date_line": ep.limits.date_line}
    if ep.endpoint_error is not None:  # the client's message names the endpoint; `kind` is its fault class
        meta["endpoint_error"] = str(ep.endpoint_error)
        meta["endpoint_fault"] = getattr(ep.endpoint_error, "kind", None)
    meta.update(metadata or {})
    return Trajectory(
        task_id=str(ep.task.id),
        trial=trial,
        seed=seed,
        messages=ep.messages,
        turns=turns,
        termination=str(env.termination),
        grade=grade,
        num_tool_calls=n_calls,
        num_tool_errors=n_err,
        metadata=meta,
    )
