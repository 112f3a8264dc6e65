"""The tiny tokenizer: Qwen's pre-tokenizer, single-token markup, and identical ids after a save/load round trip
through transformers' Auto classes (the path veRL and vLLM take)."""

from __future__ import annotations

import json

import pytest

from longhaul.tiny.tokenizer import MARKUP_TOKENS, SPECIAL_TOKENS, build_hf_tokenizer, load_chat_template

CORPUS = [
    "Agents must verify the user id before changing a reservation.\n\nBaggage: economy gets one free bag.",
    '{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}',
    "I'd like to cancel reservation ABC123 — it's urgent. Thanks!",
] * 30


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from longhaul.tiny.models import TinyArch, build_qwen2_config

    tok = build_hf_tokenizer(CORPUS, vocab_size=600)
    out = tmp_path_factory.mktemp("tiny")
    tok.save_pretrained(out)
    arch = TinyArch(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    build_qwen2_config(
        arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(out)
    return tok, out


def test_special_and_markup_tokens_are_single_tokens(saved):
    tok, _ = saved
    for t in (*SPECIAL_TOKENS, *MARKUP_TOKENS):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # Markup survives decoding with skip_special_tokens (vLLM's hermes parser reads the decoded text).
    ids = tok("<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert "<tool_call>" in text and "<|im_end|>" not in text


def test_auto_tokenizer_round_trip_gives_identical_ids(saved):
    from transformers import AutoConfig, AutoTokenizer

    tok, out = saved
    assert AutoConfig.from_pretrained(out).model_type == "qwen2"
    loaded = AutoTokenizer.from_pretrained(out)
    texts = [*CORPUS[:3], "  spaces\t and\r\nnewlines\n\n\n 123456 ünïcödé", "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        assert loaded(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert loaded.apply_chat_template(
        msgs, tools=tools, tokenize=False, add_generation_prompt=True
    ) == tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)


def test_chat_template_renders_tools_in_system_and_hermes_calls(saved):
    tok, _ = saved
    tools = [{"type": "function", "function": {"name": "get_user_details", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "system", "content": "POLICY"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_user_details", "arguments": '{"user_id": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "R1"},
        {"role": "tool", "tool_call_id": "d", "content": "R2"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nPOLICY\n\n# Tools\n")
    assert json.dumps(tools[0]) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "x"}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert "# Tools" not in tok.apply_chat_template(msgs[:2], tokenize=False)
    assert load_chat_template() == tok.chat_template
