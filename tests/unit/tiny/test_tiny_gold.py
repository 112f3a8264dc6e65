"""Gold-action conversations have the episode runner's shape and the tool-call checker is strict."""

from __future__ import annotations

import json

from longhaul.tiny.gold import (
    build_gold_conversation,
    closing_message,
    first_user_message,
    gold_actions,
    parse_tool_calls,
)


def test_gold_conversation_matches_runner_message_shapes():
    from longhaul.envs.airline.tasks import get_task, policy_text
    from longhaul.envs.prompt import build_initial_messages

    task = get_task("1").raw
    actions = gold_actions(task)
    assert actions and actions[0][0] == "get_user_details"
    initial = build_initial_messages(
        policy_text(), "The current date is 2024-05-15 (Wednesday).", first_user_message(task)
    )
    results = [f"result {i}" for i in range(len(actions))]
    conv = build_gold_conversation(initial, actions, results, closing_message(task))
    assert conv[:2] == initial and "raj_sanchez_7340" in conv[1]["content"]
    body = conv[2:-1]
    assert [m["role"] for m in body] == ["assistant", "tool"] * len(actions)
    for (name, args), call, res, out in zip(actions, body[::2], body[1::2], results, strict=True):
        tc = call["tool_calls"][0]
        assert tc["function"]["name"] == name and json.loads(tc["function"]["arguments"]) == args
        assert res["tool_call_id"] == tc["id"] and res["name"] == name and res["content"] == out
    assert conv[-1]["role"] == "assistant" and not conv[-1].get("tool_calls")


def test_parse_tool_calls_counts_only_well_formed_known_calls():
    names = ["get_user_details"]
    text = (
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "a"}}\n</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "get_user_details", "arguments": "x"}</tool_call>'
        '<tool_call>{"name": "get_user_details", "arguments": {</tool_call>'
    )
    assert parse_tool_calls(text, names) == (1, 4)
    assert parse_tool_calls("no call here", names) == (0, 0)


def test_first_turn_variants_keep_the_runner_prompt_and_first_gold_call():
    import random

    from longhaul.envs.airline.tasks import get_task, policy_text
    from longhaul.envs.prompt import build_initial_messages
    from longhaul.tiny.gold import build_first_turn, opening_variants

    task = get_task("1").raw
    variants = opening_variants(task, ["alpha", "beta", "gamma"], random.Random(0), n_noise=2)
    assert variants == opening_variants(task, ["alpha", "beta", "gamma"], random.Random(0), n_noise=2)  # seeded
    noise = variants[-2:]
    assert all(set(v.split()) <= {"alpha", "beta", "gamma"} for v in noise)
    assert any("raj_sanchez_7340" in v for v in variants[:-2])
    initial = build_initial_messages(policy_text(), "date", variants[0])
    conv = build_first_turn(initial, gold_actions(task)[0])
    assert conv[:2] == initial and len(conv) == 3
    call = conv[2]["tool_calls"][0]["function"]
    assert call["name"] == "get_user_details" and json.loads(call["arguments"]) == {"user_id": "raj_sanchez_7340"}
