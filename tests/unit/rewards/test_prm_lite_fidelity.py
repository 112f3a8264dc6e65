"""PRM-Lite fidelity (issue 14, item 7): the call signature, the think bonus after an implicit think, the
cheap-reasoning rule in seed_compat's production path and the original's floating-point order."""

from __future__ import annotations

import random

import pytest

from longhaul.envs.trajectory import Grade, ToolCall, Trajectory, Turn
from longhaul.rewards.prm_lite import (
    ActionEntry,
    build_action_history,
    score_prm_lite,
    score_trajectory,
)

E = ActionEntry
U = "mia_li_3668"
PAX = [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}]


def fired(history, rule, seed_compat):
    res = score_prm_lite(history, seed_compat=seed_compat)
    return [s.index for s in res.steps if any(h.rule == rule for h in s.hits)] + [
        -1 for h in res.trajectory_hits if h.rule == rule
    ]


# ---------------------------------------------------------------------------------------------------------
# (a) The signature is type-exact and depends on the entry alone.

#: Argument pairs that are different calls: the original's lower-cased sorted-key JSON differs.
DIFFERENT = {
    "float vs string, with a list argument": (
        {"total_baggages": 1.0, "passengers": PAX},
        {"total_baggages": "1.0", "passengers": PAX},
    ),
    "float vs string": ({"total_baggages": 1.0}, {"total_baggages": "1.0"}),
    "int vs float": ({"total_baggages": 1}, {"total_baggages": 1.0}),
    "bool vs string": ({"nonfree_baggages": 0, "insurance": True}, {"nonfree_baggages": 0, "insurance": "true"}),
    "null vs string": ({"payment_id": None}, {"payment_id": "null"}),
    "list vs its JSON text": ({"flights": ["HAT001"]}, {"flights": '["hat001"]'}),
    "list vs its JSON text, with another list": (
        {"flights": ["HAT001"], "passengers": PAX},
        {"flights": '["hat001"]', "passengers": PAX},
    ),
    "float vs string inside a list": ({"passengers": [{"n": 1.0}]}, {"passengers": [{"n": "1.0"}]}),
}
#: Pairs the original treats as the same call: letter case and key order are ignored.
SAME = {
    "letter case": ({"reservation_id": "abc123", "passengers": PAX}, {"reservation_id": "ABC123", "passengers": PAX}),
    "key order": ({"total_baggages": 1.0, "passengers": PAX}, {"passengers": PAX, "total_baggages": 1.0}),
}
#: Other entries around the pair must not change how it compares.
IMPLICIT = E("implicit_think", content="x" * 150, param_str="")  # as `build_action_history` makes it
CONTEXTS = {
    "alone": lambda a, b: ([a, b], 1),
    "after an implicit_think": lambda a, b: ([IMPLICIT, a, b], 2),
    "before an implicit_think": lambda a, b: ([a, b, IMPLICIT], 1),
    "after an entry with its own param_str": lambda a, b: (
        [E("calculate", {"expression": "1+1"}, param_str="1+1"), a, b],
        2,
    ),
}
TOOL = "update_reservation_passengers"


@pytest.mark.parametrize("seed_compat", [True, False])
@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("pair", [*DIFFERENT, *SAME])
def test_redundancy_signature_is_type_exact_and_independent_of_other_entries(pair, context, seed_compat):
    a, b = DIFFERENT.get(pair) or SAME[pair]
    history, at = CONTEXTS[context](E(TOOL, a), E(TOOL, b))
    assert (at in fired(history, "redundancy", seed_compat)) == (pair in SAME)


@pytest.mark.parametrize("seed_compat", [True, False])
@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("pair", [*DIFFERENT, *SAME])
def test_error_repetition_uses_the_same_signature(pair, context, seed_compat):
    a, b = DIFFERENT.get(pair) or SAME[pair]
    history, at = CONTEXTS[context](E(TOOL, a, is_error=True), E(TOOL, b))
    same = pair in SAME
    assert (at in fired(history, "error_repetition", seed_compat)) == same
    assert (at in fired(history, "recovery", seed_compat)) == (not same)


def test_signature_is_the_original_param_str():
    e = E(TOOL, {"total_baggages": 1.0, "Reservation_ID": "ABC123"})
    assert e.key == e.signature == (TOOL, '{"reservation_id": "abc123", "total_baggages": 1.0}')
    assert E(TOOL, {"x": 1}, param_str="custom").key == (TOOL, "custom")


# ---------------------------------------------------------------------------------------------------------
# (b) A think right after an implicit think (a message to the user, then the user's reply).


def _think_after_message() -> Trajectory:
    long = "Here is what I found: your reservation ABC123 has two flights and one checked bag; " * 2
    turns = [
        Turn(0, "", [ToolCall("think", {"thought": "find the user"}, "", "c0", result="")]),
        Turn(1, long, [], to_user=True),  # -> implicit_think
        Turn(2, "", [ToolCall("think", {"thought": "the user wants to add a bag"}, "", "c2", result="")]),
        Turn(3, "", [ToolCall("get_user_details", {"user_id": U}, "", "c3", result='{"user_id": "mia_li_3668"}')]),
    ]
    return Trajectory("1", 0, 0, [], turns, "user_stop", Grade(False, 0.0, False, False), 3, 0)


def test_think_after_implicit_think_earns_its_bonus_in_default_mode_only():
    hist, _ = build_action_history(_think_after_message())
    assert [e.tool for e in hist] == ["think", "implicit_think", "think", "get_user_details"]
    # Default: the implicit think neither earns the bonus nor blocks the next think's.
    assert fired(hist, "think_bonus", False) == [0, 2]
    # Original: the implicit think counts as "the previous think" and blocks the next think's bonus (and is
    # itself blocked here by the think before it).
    assert fired(hist, "think_bonus", True) == [0]
    alone = hist[1:]
    assert fired(alone, "think_bonus", True) == [0] and fired(alone, "think_bonus", False) == [1]
    # Two explicit thinks in a row are still paid once in both modes.
    two = [E("think", {"thought": "a"}), E("think", {"thought": "b"}), E("get_user_details", {"user_id": U})]
    assert fired(two, "think_bonus", False) == fired(two, "think_bonus", True) == [0]


# ---------------------------------------------------------------------------------------------------------
# (c) seed_compat's production path never fires the cheap-reasoning rule.


def _short_texts() -> Trajectory:
    turns = [
        Turn(0, "ok", [ToolCall("get_user_details", {"user_id": U}, "", "c0", result='{"user_id": "mia_li_3668"}')]),
        Turn(1, "checking", [ToolCall("list_all_airports", {}, "", "c1", result="JFK LAX")]),
        Turn(
            2,
            "Let me look at the reservation in detail now.",
            [ToolCall("get_reservation_details", {"reservation_id": "ABC123"}, "", "c2", result='{"id": "ABC123"}')],
        ),
        Turn(
            3,
            "Your reservation ABC123 is confirmed for May 20; the checked bag is included at no charge. Anything else?",
            [],
            to_user=True,
        ),
    ]
    return Trajectory("2", 0, 0, [], turns, "user_stop", Grade(True, 1.0, True, True), 3, 0)


def test_seed_compat_production_history_has_no_turn_text_so_p9_never_fires():
    traj = _short_texts()
    seed = score_trajectory(traj, seed_compat=True)
    assert "cheap_reasoning" not in seed.rule_counts()
    hist, _ = build_action_history(traj, seed_compat=True)
    assert [e.content for e in hist[:3]] == ["", "", ""]
    assert hist[3].tool == "implicit_think" and hist[3].content == traj.turns[3].content[:300]  # recorded there
    # Default mode sees the text: the two short ones are penalised.
    assert score_trajectory(traj).rule_counts()["cheap_reasoning"] == 2
    # The scoring function itself still has the rule (the original's unit tests and doc example pass text).
    with_text, _ = build_action_history(traj)
    assert score_prm_lite(with_text, seed_compat=True).rule_counts()["cheap_reasoning"] == 2


# ---------------------------------------------------------------------------------------------------------
# (d) The original's floating-point order: ((mean + P5) + B7) + P8, the mean summed left to right.


def test_doc_example_is_exactly_the_originals_float():
    from unit.rewards.test_prm_lite_seed import doc_example_history

    res = score_prm_lite(doc_example_history(), seed_compat=True)
    # mean + P5 + P8 one addition at a time; mean + (P5 + P8) gives -0.037777777777777785.
    assert res.process == -0.03777777777777778


def test_all_three_adjustments_in_the_originals_order():
    reads = [E("get_user_details", {"user_id": U}), E("list_all_airports"), E("calculate", {"expression": "1+1"})]
    hist = reads + [E("calculate", {"expression": f"{i}*2"}) for i in range(13)]
    res = score_prm_lite(hist, seed_compat=True)
    assert [h.rule for h in res.trajectory_hits] == ["no_reasoning", "read_diversity", "length_penalty"]
    assert res.mean_step_score == 0.03 / 16
    # ((0.001875 - 0.05) + 0.01) - 0.08; adding the three adjustments' sum instead gives -0.118125.
    assert res.process == -0.11812500000000001


def _random_history(rng: random.Random) -> list[ActionEntry]:
    calls = [
        ("get_user_details", lambda: {"user_id": rng.choice([U, "ann_lee_12", "unknown"])}),
        ("get_reservation_details", lambda: {"reservation_id": rng.choice(["ABC123", "XYZ789", "previous"])}),
        (
            "search_direct_flight",
            lambda: {"origin": "JFK", "destination": rng.choice(["LAX", "SFO"]), "date": "2024-05-20"},
        ),
        ("list_all_airports", dict),
        ("cancel_reservation", lambda: {"reservation_id": rng.choice(["ABC123", "XYZ789"])}),
        ("calculate", lambda: {"expression": rng.choice(["1+1", "2*3"])}),
        ("transfer_to_human_agents", lambda: {"summary": "refund"}),
        ("think", lambda: {"thought": "plan"}),
    ]
    out = []
    for _ in range(rng.randint(1, 24)):
        tool, args = rng.choice(calls)
        err = rng.random() < 0.2
        out.append(
            E(
                tool,
                args(),
                is_error=err,
                entities={} if err else {"reservation_id": ("ABC123", "XYZ789")},
                content=rng.choice(["", "ok", "Let me check the reservation details for you."]),
            )
        )
    return out


def test_aggregation_order_on_random_histories():
    rng = random.Random(14)
    for _ in range(500):
        res = score_prm_lite(_random_history(rng), seed_compat=True)
        total = 0.0
        for s in res.steps:
            step = 0.0
            for h in s.hits:
                step += h.weight
            assert s.score == step
            total += step
        raw = total / len(res.steps)
        for h in res.trajectory_hits:  # P5, B7, P8 in this order
            raw += h.weight
        assert res.raw == raw
        assert res.process == max(-0.5, min(0.5, raw))
