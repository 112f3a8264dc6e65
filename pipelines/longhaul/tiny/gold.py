"""Gold-action conversations for the tiny policy's warm start, and a check of emitted tool calls.

A gold conversation is the episode runner's own prompt (system = policy text + date line, tools = the 14 airline
schemas, first user message) followed by the task's reference actions as assistant tool calls, each answered by
the tool's real result, and a closing message to the user. Pure: tool results are passed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

#: Closing message after the reference actions (the tiny model must also learn to end a tool-call streak).
CLOSING_MESSAGE = "Your request has been handled. Is there anything else I can help you with?"

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def first_user_message(task: dict[str, Any]) -> str:
    """A plain first message from the task's user instructions (known facts, then the reason for calling)."""
    instr = (task.get("user_scenario") or {}).get("instructions") or {}
    parts = [instr.get("known_info"), instr.get("reason_for_call")]
    return "\n".join(p.strip() for p in parts if isinstance(p, str) and p.strip())


def gold_actions(task: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(tool name, arguments) of the task's reference actions, in order."""
    actions = ((task.get("evaluation_criteria") or {}).get("actions")) or []
    return [(a["name"], dict(a.get("arguments") or {})) for a in actions]


def build_gold_conversation(
    initial_messages: Sequence[dict[str, Any]],
    actions: Sequence[tuple[str, dict[str, Any]]],
    results: Sequence[str],
    closing: str = CLOSING_MESSAGE,
) -> list[dict[str, Any]]:
    """OpenAI-format messages: the runner's initial messages, one assistant tool call + tool result per action
    (messages shaped exactly like the runner appends them), then the closing message."""
    if len(actions) != len(results):
        raise ValueError(f"{len(actions)} actions but {len(results)} results")
    messages = [dict(m) for m in initial_messages]
    for i, ((name, args), result) in enumerate(zip(actions, results, strict=True)):
        cid = f"call_{i}_0"
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": result})
    messages.append({"role": "assistant", "content": closing})
    return messages


def opening_variants(task: dict[str, Any], noise_words: Sequence[str], rng: Any, n_noise: int = 2) -> list[str]:
    """Other first user messages for the same task: each part of the instructions alone, a greeting, and
    `n_noise` word salads (the tiny user simulator talks nonsense; the policy must still act with a tool call)."""
    instr = (task.get("user_scenario") or {}).get("instructions") or {}
    parts = [instr.get(k) for k in ("reason_for_call", "known_info", "task_instructions")]
    out = [p.strip() for p in parts if isinstance(p, str) and p.strip()]
    if out:
        out.append("Hi! " + out[0].splitlines()[0])
    for _ in range(n_noise):
        out.append(" ".join(rng.choice(noise_words) for _ in range(rng.randint(3, 24))))
    return out


def build_first_turn(
    initial_messages: Sequence[dict[str, Any]], action: tuple[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """A one-turn conversation: the runner's initial messages and the first reference tool call."""
    name, args = action
    return [dict(m) for m in initial_messages] + [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0_0",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
            ],
        }
    ]


def closing_message(task: dict[str, Any]) -> str:
    """The final message to the user: the strings the task requires to be communicated, if any."""
    info = [str(s) for s in ((task.get("evaluation_criteria") or {}).get("communicate_info") or [])]
    return f"Here is what you asked for: {'; '.join(info)}. {CLOSING_MESSAGE}" if info else CLOSING_MESSAGE


def parse_tool_calls(text: str, tool_names: Sequence[str]) -> tuple[int, int]:
    """(well-formed, total) `<tool_call>` blocks in `text`: well-formed = JSON object with a known tool `name`
    and an object `arguments`."""
    blocks = _TOOL_CALL.findall(text)
    good = 0
    for block in blocks:
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("name") in tool_names and isinstance(obj.get("arguments"), dict):
            good += 1
    return good, len(blocks)
