"""Scripted policy and user for the τ² airline tasks, served by `support.openai_stub.StubServer`.

The scripted user finds its task by the scenario text in its system prompt and opens with a tag
`[task:<id> attempt:<a>]`, where `a` counts how often that task has been opened on this server (so the number of
each behaviour per task is fixed whatever order concurrent episodes arrive in). After any agent message it says
`###STOP###`.

Policies ("model" names):
- `gold`: replays the task's gold actions as OpenAI tool calls, then says the required strings.
- `flaky`: succeeds on attempts a < int(task_id) % 5 (so with n = 4 trials a task has c = id % 5, capped at 4),
  with a hallucinated tool call first on even task ids (an error that must not fail the episode); otherwise it
  fails: malformed tool-call JSON every turn (in `tool_calls` or as a Hermes `<tool_call>` block) until the turn
  limit, or an empty turn (policy format error).
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from typing import Any

from support.openai_stub import Reply

_TAG = re.compile(r"\[task:(\S+) attempt:(\d+)\]")
_SCENARIO = re.compile(r"<scenario>\n(.*)\n</scenario>", re.DOTALL)


def _tasks() -> dict[str, Any]:
    from longhaul.envs.airline.tasks import load_tasks

    return load_tasks()


class ScriptedUser:
    """The scripted customer (thread-safe attempt counters)."""

    def __init__(self) -> None:
        self._by_text = {t.user_instructions().strip(): tid for tid, t in _tasks().items()}
        self._attempts: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        msgs = body["messages"]
        m = _SCENARIO.search(msgs[0]["content"])
        if m is None or m.group(1).strip() not in self._by_text:
            return Reply(content="I am not sure what I need. ###STOP###")
        tid = self._by_text[m.group(1).strip()]
        if len(msgs) <= 2:  # system + the agent's greeting: the opening message
            with self._lock:
                a = self._attempts[tid]
                self._attempts[tid] += 1
            return Reply(content=f"Hello, I need help with my trip. [task:{tid} attempt:{a}]")
        return Reply(content="Thank you, that is all. ###STOP###")


def _tag(body: dict[str, Any]) -> tuple[str, int]:
    for msg in body["messages"]:
        if msg.get("role") == "user":
            m = _TAG.search(msg.get("content") or "")
            if m:
                return m.group(1), int(m.group(2))
            break
    raise ValueError("no [task:… attempt:…] tag in the first user message")


def gold_plan(task_id: str) -> list[Reply]:
    task = _tasks()[task_id]
    plan = [Reply(tool_calls=[(a.name, dict(a.arguments))]) for a in task.actions]
    final = "Everything is taken care of."
    if task.communicate_info:
        final += " The details: " + "; ".join(task.communicate_info) + "."
    plan.append(Reply(content=final))
    return plan


def flaky_target(task_id: str) -> int:
    """Successful trials per task under the flaky policy with n = 4."""
    return min(int(task_id) % 5, 4)


def flaky_plan(task_id: str, attempt: int) -> list[Reply] | Reply:
    """A list of turns, or one Reply repeated for every turn."""
    if attempt < flaky_target(task_id):
        prefix = (
            [Reply(tool_calls=[("update_user_payment_methods", {"user_id": "nobody_0"})])]
            if int(task_id) % 2 == 0
            else []
        )
        return prefix + gold_plan(task_id)
    if attempt % 2 == 1:
        return [Reply(tool_calls=[("list_all_airports", {})]), Reply(content="")]
    if attempt % 4 == 0:
        return Reply(tool_calls=[("get_reservation_details", '{"reservation_id": ')])
    return Reply(content='Let me check. <tool_call>{"name": "get_user_details", "arguments": {"user_id": </tool_call>')


def _assistant_turns(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m.get("role") == "assistant")


def gold_policy(body: dict[str, Any]) -> Reply:
    tid, _ = _tag(body)
    plan = gold_plan(tid)
    s = _assistant_turns(body)
    return plan[s] if s < len(plan) else Reply(content="Is there anything else I can help with?")


def flaky_policy(body: dict[str, Any]) -> Reply:
    tid, attempt = _tag(body)
    plan = flaky_plan(tid, attempt)
    if isinstance(plan, Reply):
        return plan
    s = _assistant_turns(body)
    return plan[s] if s < len(plan) else Reply(content="Is there anything else I can help with?")


def airline_scripts(kind: str = "airline-gold") -> dict[str, Any]:
    """Scripts for a server: models `policy` (gold or flaky by `kind`), `gold`, `flaky` and `user`."""
    policy = gold_policy if kind == "airline-gold" else flaky_policy
    return {"policy": policy, "gold": gold_policy, "flaky": flaky_policy, "user": ScriptedUser()}
