"""A tokenizer trained on the real airline policy text and tool schemas, with longhaul's Qwen2.5-style template."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def airline_tools() -> list[dict]:
    from longhaul.envs.prompt import tool_schemas

    return tool_schemas()


@pytest.fixture(scope="session")
def system_prompt() -> str:
    from longhaul.envs.airline.tasks import policy_text
    from longhaul.envs.prompt import build_system_prompt

    return build_system_prompt(policy_text(), "The current date is 2024-05-15 (Wednesday).")


@pytest.fixture(scope="session")
def tokenizer(airline_tools, system_prompt):
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    corpus = [system_prompt, *(json.dumps(t) for t in airline_tools)]
    corpus += ['{"user_id": "mia_li_3668"}', '{"reservation_id": "ABC123"}', "Hello, how can I help you today?"]
    return build_hf_tokenizer(corpus, vocab_size=1500)


@pytest.fixture()
def conversation(system_prompt) -> list[dict]:
    """Multi-turn: tool call, tool result, a second call, its result, a message to the user, the user's reply."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": "Hi, I want to cancel reservation ABC123. My user id is mia_li_3668."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0_0",
                    "type": "function",
                    "function": {"name": "get_user_details", "arguments": '{"user_id": "mia_li_3668"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_0_0",
            "name": "get_user_details",
            "content": '{"user_id": "mia_li_3668", "reservations": ["ABC123"]}',
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "get_reservation_details", "arguments": '{"reservation_id": "ABC123"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1_0",
            "name": "get_reservation_details",
            "content": '{"reservation_id": "ABC123", "cabin": "economy", "insurance": "no"}',
        },
        {"role": "assistant", "content": "Your reservation ABC123 cannot be cancelled for a refund."},
        {"role": "user", "content": "OK, thanks. ###STOP###"},
    ]
