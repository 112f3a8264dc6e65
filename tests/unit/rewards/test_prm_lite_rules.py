"""Every PRM-Lite rule fires on a crafted positive case and stays silent on its negative twin (method.md h.17),
in both modes; the default mode's fixes; overrides; and the history built from a real Trajectory record."""

from __future__ import annotations

import pytest

from longhaul.envs.trajectory import Grade, ToolCall, Trajectory, Turn
from longhaul.rewards.prm_lite import (
    ActionEntry,
    build_action_history,
    build_rule_params,
    score_prm_lite,
    score_trajectory,
)

E = ActionEntry
U = "mia_li_3668"


def fired(history, rule, seed_compat, **kw):
    res = score_prm_lite(history, seed_compat=seed_compat, **kw)
    return [s.index for s in res.steps if any(h.rule == rule for h in s.hits)] + [
        -1 for h in res.trajectory_hits if h.rule == rule
    ]


CASES = {
    # rule: (positive history, index that must fire (-1 = trajectory level), negative history)
    "placeholder": (
        [E("get_reservation_details", {"reservation_id": "unknown"})],
        0,
        [E("get_reservation_details", {"reservation_id": "ABC123"})],
    ),
    "redundancy": (
        [E("get_user_details", {"user_id": U}), E("get_user_details", {"user_id": U})],
        1,
        [E("get_user_details", {"user_id": U}), E("get_user_details", {"user_id": "ann_lee_1"})],
    ),
    "error_repetition": (
        [
            E("cancel_reservation", {"reservation_id": "ABC123"}, is_error=True),
            E("cancel_reservation", {"reservation_id": "ABC123"}),
        ],
        1,
        [E("cancel_reservation", {"reservation_id": "ABC123"}), E("cancel_reservation", {"reservation_id": "ABC123"})],
    ),
    "recovery": (
        [E("cancel_reservation", {"reservation_id": "ABC123"}, is_error=True), E("get_user_details", {"user_id": U})],
        1,
        [E("cancel_reservation", {"reservation_id": "ABC123"}), E("get_user_details", {"user_id": U})],
    ),
    "escalation": (
        [E("transfer_to_human_agents", {"summary": "wants a refund"})],
        0,
        [E("get_user_details", {"user_id": U})],
    ),
    "data_chain": (
        [
            E("get_user_details", {"user_id": U}, entities={"reservation_id": ("ABC123",)}),
            E("cancel_reservation", {"reservation_id": "ABC123"}),
        ],
        1,
        [E("get_user_details", {"user_id": U}), E("cancel_reservation", {"reservation_id": "ABC123"})],
    ),
    "first_read": (
        [E("get_user_details", {"user_id": U})],
        0,
        [E("cancel_reservation", {"reservation_id": "ABC123"})],
    ),
    "think_bonus": (
        [E("think", {"thought": "look up the user"}), E("get_user_details", {"user_id": U})],
        0,
        [E("get_user_details", {"user_id": U}), E("think", {"thought": "y"})],  # a think as the last entry
    ),
    "cheap_reasoning": (
        [E("get_user_details", {"user_id": U}, content="ok")],
        0,
        [E("get_user_details", {"user_id": U}, content="Let me look up your profile to find the booking.")],
    ),
    "no_reasoning": (
        [E("get_user_details", {"user_id": U}), E("list_all_airports"), E("calculate", {"expression": "1+1"})],
        -1,
        [E("think", {"thought": "plan"}), E("get_user_details", {"user_id": U}), E("list_all_airports")],
    ),
    "read_diversity": (
        [E("get_user_details", {"user_id": U}), E("list_all_airports"), E("calculate", {"expression": "1+1"})],
        -1,
        [E("get_user_details", {"user_id": U}), E("list_all_airports"), E("list_all_airports")],
    ),
    "length_penalty": (
        [E("calculate", {"expression": f"{i}+1"}) for i in range(9)],
        -1,
        [E("calculate", {"expression": f"{i}+1"}) for i in range(8)],
    ),
}


@pytest.mark.parametrize("seed_compat", [True, False])
@pytest.mark.parametrize("rule", list(CASES))
def test_rule_fires_and_stays_silent(rule, seed_compat):
    pos, where, neg = CASES[rule]
    assert where in fired(pos, rule, seed_compat), f"{rule} did not fire"
    assert fired(neg, rule, seed_compat) == [], f"{rule} fired on the negative case"


@pytest.mark.parametrize("seed_compat", [True, False])
def test_escalation_premature_vs_late(seed_compat):
    t = E("transfer_to_human_agents", {"summary": "wants a refund"})
    early = score_prm_lite([t], seed_compat=seed_compat).steps[0].hits
    late = score_prm_lite([E("get_user_details", {"user_id": U}), t], seed_compat=seed_compat).steps[1].hits
    assert [h.weight for h in early if h.rule == "escalation"] == [-0.10]
    assert [h.weight for h in late if h.rule == "escalation"] == [-0.05]


def test_think_bonus_exceptions():
    think = E("think", {"thought": "plan"})
    # (a) the second of two consecutive thinks earns nothing (the first does).
    assert fired([think, E("think", {"thought": "more"}), E("list_all_airports")], "think_bonus", False) == [0]
    # (b) last entry, (c) followed by a placeholder or by a redundant call.
    assert fired([E("get_user_details", {"user_id": U}), think], "think_bonus", False) == []
    assert fired([think, E("get_reservation_details", {"reservation_id": "unknown"})], "think_bonus", False) == []
    redundant = [E("get_user_details", {"user_id": U}), think, E("get_user_details", {"user_id": U})]
    assert fired(redundant, "think_bonus", False) == []


def test_default_mode_fixes_substring_placeholder():
    # "Bethany" contains "any": the original flags it, the default mode does not.
    call = [E("update_reservation_passengers", {"reservation_id": "ABC123", "first_name": "Bethany"})]
    assert fired(call, "placeholder", True) == [0]
    assert fired(call, "placeholder", False) == []
    # Free-text arguments (a transfer summary) are not placeholder candidates in default mode.
    summary = [E("transfer_to_human_agents", {"summary": "The user wants any flight after the first of May"})]
    assert fired(summary, "placeholder", True) == [0]
    assert fired(summary, "placeholder", False) == []
    # Real placeholders still fire.
    assert fired([E("get_reservation_details", {"reservation_id": "previous_reservation"})], "placeholder", False) == [
        0
    ]


def test_default_mode_window_ignores_think_entries():
    # Original: thinks use up the 3-entry window, so interleaving thinks hides a repeat; default: they do not.
    call = E("get_user_details", {"user_id": U})
    th = [E("think", {"thought": f"t{i}"}) for i in range(3)]
    hist = [call, *th, call]
    assert fired(hist, "redundancy", True) == []
    assert fired(hist, "redundancy", False) == [4]


def test_default_mode_implicit_think_earns_no_bonus():
    hist = [E("implicit_think", content="x" * 150), E("get_user_details", {"user_id": U})]
    assert fired(hist, "think_bonus", True) == [0]
    assert fired(hist, "think_bonus", False) == []
    # It still counts as reasoning in both modes (no P5 penalty).
    hist3 = [*hist, E("list_all_airports")]
    assert fired(hist3, "no_reasoning", False) == [] and fired(hist3, "no_reasoning", True) == []


def test_get_flight_status_is_a_read_tool_in_default_mode_only():
    hist = [E("get_flight_status", {"flight_number": "HAT001", "date": "2024-05-16"})]
    assert fired(hist, "first_read", False) == [0]
    assert fired(hist, "first_read", True) == []


def test_overrides_and_disabling():
    hist = [E("get_reservation_details", {"reservation_id": "unknown"})]
    p = build_rule_params({"placeholder": {"read_weight": -0.2}, "first_read": {"enabled": False}})
    res = score_prm_lite(hist, p)
    assert res.process == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="valid: read_weight, write_weight, enabled"):
        build_rule_params({"placeholder": {"weight": 1.0}})
    with pytest.raises(ValueError, match="unknown PRM-Lite rule 'nope'"):
        build_rule_params({"nope": {}})


def test_clip_override():
    hist = [E("transfer_to_human_agents", {"summary": "x"})] * 30
    p = build_rule_params({"aggregate": {"clip": 0.1}})
    assert score_prm_lite(hist, p).process == -0.1


def make_trajectory():
    turns = [
        Turn(
            0,
            "Let me look up your profile first, please hold on.",
            [
                ToolCall(
                    "get_user_details",
                    {"user_id": U},
                    '{"user_id": "mia_li_3668"}',
                    "c0",
                    result='{"user_id": "mia_li_3668", "reservations": ["ABC123"]}',
                )
            ],
        ),
        Turn(
            1,
            "",
            [
                ToolCall(
                    "update_reservation_detailz",
                    {"x": 1},
                    '{"x": 1}',
                    "c1",
                    result="Error: unknown tool",
                    is_error=True,
                    known_tool=False,
                )
            ],
        ),
        Turn(
            2,
            "",
            [
                ToolCall(
                    "cancel_reservation",
                    None,
                    "{bad",
                    "c2",
                    result="Error: bad JSON",
                    is_error=True,
                    parse_error="Expecting property name",
                )
            ],
        ),
        Turn(
            3,
            "I will cancel it now.",
            [
                ToolCall(
                    "cancel_reservation",
                    {"reservation_id": "ABC123"},
                    '{"reservation_id": "ABC123"}',
                    "c3",
                    result='{"status": "cancelled"}',
                )
            ],
        ),
        Turn(
            4,
            "Your reservation ABC123 has been cancelled. The refund goes back to the original payment "
            "method within 5 to 7 business days. Anything else?",
            [],
            to_user=True,
        ),
    ]
    return Trajectory("7", 0, 1, [], turns, "user_stop", Grade(True, 1.0, True, True), 4, 2)


def test_history_from_trajectory():
    traj = make_trajectory()
    hist, stats = build_action_history(traj)
    assert [e.tool for e in hist] == ["get_user_details", "cancel_reservation", "implicit_think"]
    assert [e.turn for e in hist] == [0, 3, 4]
    assert hist[0].entities["reservation_id"] == ("ABC123",) and hist[0].entities["user_id"] == (U,)
    assert hist[2].content == traj.turns[4].content[:300]
    assert (stats.num_unknown_tool_calls, stats.num_unparsed_tool_calls) == (1, 1)
    res = score_trajectory(traj)
    assert res.num_unknown_tool_calls == 1 and res.num_unparsed_tool_calls == 1
    assert len(res.turn_scores) == 5 and sum(res.turn_scores) == pytest.approx(res.process)
    # The dict form (what `longhaul explain` reads) scores identically.
    assert score_trajectory(traj.to_dict()).process == res.process
    # Penalising unknown/unparsable calls is opt-in (default mode only).
    pen = score_trajectory(traj, build_rule_params({"unknown_tool": {"weight": -0.05}}))
    assert pen.process == pytest.approx(res.process - 0.10)
    assert (
        score_trajectory(traj, build_rule_params({"unknown_tool": {"weight": -0.05}}), seed_compat=True).process
        == score_trajectory(traj, seed_compat=True).process
    )


def test_implicit_think_duplicates_dropped():
    long = "x" * 120
    turns = [Turn(0, long, [], to_user=True), Turn(1, long, [], to_user=True), Turn(2, "short", [], to_user=True)]
    hist, _ = build_action_history(Trajectory("1", 0, None, [], turns, "user_stop", None))
    assert [e.tool for e in hist] == ["implicit_think"]


def test_entity_scan_equals_separate_patterns():
    """The one-pass entity scan finds exactly what the five separate regexes of the original find."""
    import random

    from longhaul.rewards.prm_lite import ENTITY_PATTERNS, extract_entities

    rng = random.Random(1)
    alphabet = 'ABCXYZ0123456789abcxyz_- ,:"[]{}'
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.5:
            text += ' {"flight": "HAT123", "res": "ABC123", "user": "mia_li_3668", "pay": "credit_card_7", "d": "2024-05-20"}'  # noqa: E501 - a string literal kept whole
        want = {k: sorted(p.findall(text)) for k, p in ENTITY_PATTERNS.items() if p.findall(text)}
        assert {k: sorted(v) for k, v in extract_entities(text).items()} == want, text
