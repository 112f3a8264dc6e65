"""The episode's prompt and the text rules the runner applies to messages (pure).

The prompt: the policy text and the date line as the system message, the 14 tool schemas, the user simulator's
first message. The rules: tool observations cut to `tool_output_limit`, and the markers that end a conversation.
"""

from __future__ import annotations

from typing import Any

#: Markers that end a conversation when the user simulator (or the agent) says them (τ² user simulator).
STOP_MARKERS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
AGENT_STOP_MARKER = "###STOP###"


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
    # deferred: the airline tools build pydantic models (~0.1 s); the prompt text needs none
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
    """Whether a message says one of the `STOP_MARKERS` (the conversation ends)."""
    return any(m in text for m in STOP_MARKERS)
