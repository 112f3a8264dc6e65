"""The tiny Qwen3 policy: a `Qwen3ForCausalLM`, built deterministically and cached by content key, with Qwen3's
think markup as single non-special tokens and longhaul's Qwen3-style chat template, whose default rendering is
Qwen3's own (earlier think blocks stripped) and whose `preserve_thinking` keeps every turn as generated."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from longhaul.tiny.qwen3 import DIRNAME, ensure_tiny_qwen3
from longhaul.tiny.tokenizer import MARKUP_TOKENS, SPECIAL_TOKENS, THINK_TOKENS


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return ensure_tiny_qwen3(tmp_path_factory.mktemp("a"), log=lambda _: None)


def test_build_is_deterministic_and_cached(built: Path, tmp_path: Path) -> None:
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    logs: list[str] = []
    assert ensure_tiny_qwen3(built.parent, log=logs.append) == built and not logs  # same key: reused
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp
    again = ensure_tiny_qwen3(tmp_path, log=lambda _: None)
    assert again.name == DIRNAME and _digest(again) == _digest(built)


def test_it_is_a_qwen3_model_with_qwen3_markup(built: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(built)
    assert cfg.model_type == "qwen3" and cfg.head_dim >= 32  # vLLM's CPU attention needs head_dim >= 32
    model = AutoModelForCausalLM.from_pretrained(built)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    tok = AutoTokenizer.from_pretrained(built)
    for t in (*SPECIAL_TOKENS, *MARKUP_TOKENS, *THINK_TOKENS):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t
    ids = tok.encode("<think>\nplan\n</think>\n\nHi<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nplan\n</think>\n\nHi"  # think markup kept
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape[-1] >= len(tok)


def test_template_renders_like_qwen3_unless_preserving(built: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built)
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    msgs = [
        {"role": "system", "content": "POLICY"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nA\n</think>\n\n", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "R"},
        {"role": "assistant", "content": "<think>\nB\n</think>\n\nOk?"},
        {"role": "user", "content": "yes"},
        {"role": "assistant", "content": "<think>\nC\n</think>\n\nDone."},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

    def render(messages, **kw):
        return tok.apply_chat_template(messages, tools=tools, tokenize=False, **kw)

    stock = render(msgs)
    assert stock.startswith("<|im_start|>system\nPOLICY\n\n# Tools\n")
    assert "A\n" not in stock and "B\n" not in stock  # earlier turns lose their reasoning…
    assert stock.endswith("<|im_start|>assistant\n<think>\nC\n</think>\n\nDone.<|im_end|>\n")  # …the last keeps it
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>' in stock
    kept = render(msgs, preserve_thinking=True)
    for m in msgs[2:]:
        if m["role"] == "assistant":
            assert "<|im_start|>assistant\n" + m["content"] in kept  # every turn verbatim
    assert render(msgs[:2], add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    off = [
        msgs[0],
        msgs[1],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        msgs[3],
        {"role": "assistant", "content": "Ok?"},
        msgs[5],
    ]
    no_think = render(off, enable_thinking=False, preserve_thinking=True)
    assert no_think.count("<|im_start|>assistant\n<think>\n\n</think>\n\n") == 2  # the empty block, every turn
    assert "<think>\n\n</think>\n\n<tool_call>" in no_think
    # a conversation renders as a token prefix of its continuation (what the agent loop and SFT rely on)
    for kw in ({"preserve_thinking": True}, {"enable_thinking": False, "preserve_thinking": True}):
        conv = msgs if kw.get("enable_thinking", True) else off
        for i in range(2, len(conv)):
            assert render(conv, **kw).startswith(render(conv[:i], **kw)), (kw, i)
    assert not render(msgs).startswith(render(msgs[:5]))  # Qwen3's own rendering is not
