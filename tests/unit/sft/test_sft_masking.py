"""Render-Twice-Diff labels with a Qwen2.5-style tool template, the prefix check, and drop-never-truncate."""

from __future__ import annotations

import json

from longhaul.sft.masking import (
    IGNORE_INDEX,
    Dropped,
    DropReason,
    SupervisedExample,
    build_supervised_dataset,
    build_supervised_example,
)


def _labelled_text(tok, ex: SupervisedExample) -> list[str]:
    return [tok.decode(ex.input_ids[a:b], skip_special_tokens=False) for a, b in ex.spans]


def test_labels_cover_exactly_assistant_content_tool_call_json_and_end_of_turn(tokenizer, conversation, airline_tools):
    ex = build_supervised_example(tokenizer, conversation, airline_tools, max_length=100_000)
    assert isinstance(ex, SupervisedExample)
    assert _labelled_text(tokenizer, ex) == [
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}\n</tool_call><|im_end|>\n',
        '<tool_call>\n{"name": "get_reservation_details", "arguments": {"reservation_id": "ABC123"}}\n</tool_call>'
        "<|im_end|>\n",
        "Your reservation ABC123 cannot be cancelled for a refund.<|im_end|>\n",
    ]
    # Labels are the input ids inside the spans and IGNORE_INDEX everywhere else.
    inside = {i for a, b in ex.spans for i in range(a, b)}
    for i, (tid, lab) in enumerate(zip(ex.input_ids, ex.labels, strict=True)):
        assert lab == (tid if i in inside else IGNORE_INDEX)
    assert ex.loss_mask == [1 if i in inside else 0 for i in range(len(ex.input_ids))]


def test_nothing_of_system_user_or_tool_turns_is_labelled(tokenizer, conversation, airline_tools):
    ex = build_supervised_example(tokenizer, conversation, airline_tools, max_length=100_000)
    unlabelled = tokenizer.decode(
        [t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m == 0], skip_special_tokens=False
    )
    labelled = "".join(_labelled_text(tokenizer, ex))
    for m in conversation:
        if m["role"] in ("user", "tool"):
            assert m["content"] in unlabelled
            assert m["content"] not in labelled
    assert "<tool_response>" not in labelled and "<|im_start|>" not in labelled


def test_prompt_holds_policy_text_and_every_tool_schema(tokenizer, conversation, airline_tools, system_prompt):
    ex = build_supervised_example(tokenizer, conversation, airline_tools, max_length=100_000)
    prompt = tokenizer.decode(ex.input_ids[: ex.spans[0][0]], skip_special_tokens=False)
    assert system_prompt.strip() in prompt
    assert len(airline_tools) == 14
    for tool in airline_tools:
        assert json.dumps(tool, ensure_ascii=False) in prompt


def test_prefix_mismatch_is_detected_and_dropped(tokenizer, conversation, airline_tools):
    # An assistant message that starts with a newline merges with the generation prompt's trailing newline into
    # one pre-token, so the rendering up to the generation prompt is no longer a token prefix.
    assert len(tokenizer("\n\n", add_special_tokens=False)["input_ids"]) == 1
    bad = [dict(m) for m in conversation]
    bad[6] = {"role": "assistant", "content": "\n\nYour reservation cannot be cancelled."}
    res = build_supervised_example(tokenizer, bad, airline_tools, max_length=100_000)
    assert isinstance(res, Dropped)
    assert res.reason == DropReason.PREFIX_MISMATCH and res.message_index == 6


def test_too_long_is_dropped_not_truncated(tokenizer, conversation, airline_tools):
    full = build_supervised_example(tokenizer, conversation, airline_tools, max_length=100_000)
    assert isinstance(full, SupervisedExample)
    exact = build_supervised_example(tokenizer, conversation, airline_tools, max_length=len(full.input_ids))
    assert isinstance(exact, SupervisedExample) and exact.input_ids == full.input_ids
    res = build_supervised_example(tokenizer, conversation, airline_tools, max_length=len(full.input_ids) - 1)
    assert isinstance(res, Dropped) and res.reason == DropReason.TOO_LONG


def test_too_few_labels_and_no_assistant(tokenizer, conversation, airline_tools):
    short = [*conversation[:2], {"role": "assistant", "content": "Ok"}]
    res = build_supervised_example(tokenizer, short, airline_tools, max_length=100_000, min_label_tokens=5)
    assert isinstance(res, Dropped) and res.reason == DropReason.TOO_FEW_LABELS
    res = build_supervised_example(tokenizer, conversation[:2], airline_tools, max_length=100_000)
    assert isinstance(res, Dropped) and res.reason == DropReason.NO_ASSISTANT


def test_dataset_counts_every_drop(tokenizer, conversation, airline_tools):
    bad = [dict(m) for m in conversation]
    bad[6] = {"role": "assistant", "content": "\n\nNo."}
    convs = [(conversation, airline_tools), (bad, airline_tools), (conversation[:2], airline_tools)]
    kept, dropped, stats = build_supervised_dataset(tokenizer, convs, max_length=100_000)
    assert len(kept) == 1 and len(dropped) == 2
    assert stats.to_dict()["dropped"] == {"no_assistant": 1, "prefix_mismatch": 1}
    assert stats.kept == 1 and stats.label_tokens == kept[0].num_label_tokens
