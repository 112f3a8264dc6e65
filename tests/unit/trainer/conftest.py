"""A tiny tokenizer (longhaul.tiny's chat template) and a random tiny Qwen2 policy, built in about a second."""

from __future__ import annotations

import pytest

CORPUS = [
    "You are an airline agent. Help the user with reservations, flights and baggage.",
    "I want to cancel my reservation ABC123 please. My user id is mia_li_3668.",
    '{"name": "get_reservation_details", "arguments": {"reservation_id": "ABC123"}}',
    "The reservation was cancelled. Is there anything else? ###STOP###",
] * 20

TOOLS = [{"type": "function", "function": {"name": "get_reservation_details", "description": "Get a reservation.",
          "parameters": {"type": "object", "properties": {"reservation_id": {"type": "string"}},
                         "required": ["reservation_id"]}}}]


def conversation(reply: str = "Sure, let me check.") -> list[dict]:
    return [
        {"role": "system", "content": "You are an airline agent."},
        {"role": "user", "content": "I want to cancel my reservation ABC123 please."},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_reservation_details", "arguments": '{"reservation_id": "ABC123"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "confirmed"}'},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Thanks ###STOP###"},
    ]


@pytest.fixture()
def tools() -> list[dict]:
    return TOOLS


@pytest.fixture()
def make_conversation():
    return conversation


@pytest.fixture(scope="session")
def tokenizer():
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    return build_hf_tokenizer(CORPUS, vocab_size=400)


@pytest.fixture()
def model(tokenizer):
    from longhaul.tiny.models import TinyArch, build_model

    arch = TinyArch(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=2048)
    return build_model(arch, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, seed=0).eval()
