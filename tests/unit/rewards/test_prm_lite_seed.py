"""PRM-Lite in seed_compat mode reproduces the original numbers (method.md a.5).

The first block ports the original unit tests with their helper's conventions: `param_str` is the test's own
string (a Python repr of the sorted items, or what the test passed), not the canonical JSON the production code
wrote. The worked examples follow.
"""

from __future__ import annotations

import pytest

from longhaul.rewards.prm_lite import ActionEntry, score_prm_lite


def act(tool, params=None, param_str=None, is_error=False, entities=None, content=""):
    """The original test helper's convention for an action-history entry."""
    return ActionEntry(
        tool=tool,
        params=params or {},
        param_str=param_str or ("{}" if not params else str(sorted(params.items()))),
        is_error=is_error,
        entities={k: tuple(v) for k, v in (entities or {}).items()},
        content=content,
    )


def score(history):
    return score_prm_lite(history, seed_compat=True).process


ORIGINAL_CASES = {
    "empty": ([], 0.0),
    "placeholder_write": ([act("book_reservation", {"reservation_id": "my_trip"})], -0.05),
    "placeholder_read": ([act("get_reservation_details", {"reservation_id": "previous_reservation"})], -0.02),
    "valid_id": ([act("get_reservation_details", {"reservation_id": "ABC123"})], 0.01),
    "redundancy": (
        [act("get_user_details", {"user_id": "john_doe_123"}, '{"user_id": "john_doe_123"}')] * 2,
        -0.01,
    ),
    "error_repetition": (
        [
            act("get_reservation_details", {"reservation_id": "BAD"}, is_error=True),
            act("get_reservation_details", {"reservation_id": "BAD"}),
        ],
        -0.045,
    ),
    "recovery": (
        [
            act("get_reservation_details", {"reservation_id": "BAD"}, is_error=True),
            act("get_user_details", {"user_id": "john_doe_123"}),
        ],
        0.02,
    ),
    "escalation_premature": ([act("transfer_to_human_agents")], -0.10),
    "escalation_late": ([act("get_user_details", {"user_id": "john_doe_123"}), act("transfer_to_human_agents")], -0.02),
    "data_chain_write": (
        [
            act("get_user_details", {"user_id": "john_doe_123"}, entities={"reservation_id": ["ABC123"]}),
            act("cancel_reservation", {"reservation_id": "ABC123"}),
        ],
        0.045,
    ),
    "first_read": (
        [
            act("get_user_details", {"user_id": "john_doe_123"}),
            act("get_reservation_details", {"reservation_id": "ABC123"}),
        ],
        0.01,
    ),
    "read_diversity": (
        [act("get_user_details"), act("get_reservation_details"), act("search_direct_flight")],
        -0.03,
    ),
    "success_bonus_removed": ([act("get_user_details")], 0.01),
    "think_valid": ([act("think"), act("get_user_details")], 0.01),
    "think_consecutive": ([act("think"), act("think")], 0.005),
    "think_last": ([act("get_user_details"), act("think")], 0.005),
    "think_then_placeholder": ([act("think"), act("book_reservation", {"reservation_id": "my_trip"})], -0.025),
    "implicit_think_150": ([act("implicit_think", content="x" * 150)], 0.0),
    "implicit_think_400": ([act("implicit_think", content="x" * 400)], 0.0),
    "no_reasoning": (
        [act("get_user_details"), act("get_reservation_details"), act("book_reservation")],
        -0.043333333333333335,
    ),
    "length_penalty": ([act("transfer_to_human_agents") for _ in range(10)], -0.197),
    "task49_like_test_convention": (
        [
            act("get_reservation_details", {"reservation_id": "MDCLVA"}, entities={"reservation_id": ["MDCLVA"]}),
            act("cancel_reservation", {"reservation_id": "MDCLVA"}),
            act("get_reservation_details", {"reservation_id": "previous_reservation"}),
            act("get_user_details", {"user_id": "emma_kim_9957"}),
            act("get_user_details", {"user_id": "emma_kim_9957"}),
            act("get_reservation_details", {"reservation_id": "previous_reservation"}),
        ],
        -0.043333333333333335,
    ),
}


@pytest.mark.parametrize("name", list(ORIGINAL_CASES))
def test_original_unit_tests_reproduce(name):
    history, expected = ORIGINAL_CASES[name]
    assert score(history) == pytest.approx(expected, abs=1e-6)


def test_clamp_lower_bound():
    assert score([act("transfer_to_human_agents")] * 5) >= -0.5
    many = [act("transfer_to_human_agents")] * 200
    res = score_prm_lite(many, seed_compat=True)
    assert res.raw < -0.5 and res.process == -0.5


def test_reward_formula_success_with_process_in_range():
    from longhaul.rewards.combine import combine_reward

    res = score_prm_lite([act("think"), act("get_user_details")], seed_compat=True)
    r = combine_reward(1.0, res, weight=0.3)
    assert 1.0 < r.score < 1.1


def test_task49_production_format_is_minus_0_05333():
    """The same 6 calls with canonical param strings (what production wrote): the two repeated calls are now
    redundant (−0.03 each) -> −0.05333, not the test file's −0.04333."""
    history = [
        ActionEntry("get_reservation_details", {"reservation_id": "MDCLVA"}, entities={"reservation_id": ("MDCLVA",)}),
        ActionEntry("cancel_reservation", {"reservation_id": "MDCLVA"}),
        ActionEntry("get_reservation_details", {"reservation_id": "previous_reservation"}),
        ActionEntry("get_user_details", {"user_id": "emma_kim_9957"}),
        ActionEntry("get_user_details", {"user_id": "emma_kim_9957"}),
        ActionEntry("get_reservation_details", {"reservation_id": "previous_reservation"}),
    ]
    res = score_prm_lite(history, seed_compat=True)
    assert [round(s.score, 10) for s in res.steps] == [0.01, 0.08, -0.03, 0.01, -0.03, -0.06]
    assert res.process == pytest.approx(-0.05333333333333334, abs=1e-6)
    # The fixed default mode agrees on this trajectory (no quirk is involved).
    assert score_prm_lite(history).process == pytest.approx(-0.05333333333333334, abs=1e-6)


def doc_example_history():
    """A 9-step history with the doc's per-step scores (ablation_plan §3.3.6): +0.01, +0.08, −0.02, +0.06, −0.03,
    −0.07, +0.09, +0.04, +0.04; two distinct READ tools, no think entry."""
    obs0 = {"user_id": ("mia_li_3668",), "reservation_id": ("ABC123", "XYZ789")}
    pay = {"reservation_id": "QQQ111", "total_baggages": 1, "nonfree_baggages": 0, "payment_id": "credit_card_1"}
    return [
        ActionEntry("get_user_details", {"user_id": "mia_li_3668"}, entities=obs0),  # first read
        ActionEntry("cancel_reservation", {"reservation_id": "ABC123"}),  # data chain (write)
        ActionEntry("update_reservation_baggages", pay, is_error=True, content="ok"),  # cheap reasoning
        ActionEntry("get_reservation_details", {"reservation_id": "KLM456"}),  # recovery + first read
        ActionEntry("get_reservation_details", {"reservation_id": "KLM456"}, is_error=True),  # redundancy
        ActionEntry("get_reservation_details", {"reservation_id": "KLM456"}, is_error=True),  # redundancy + error rep.
        ActionEntry("get_reservation_details", {"reservation_id": "XYZ789"}),  # recovery + data chain (read)
        ActionEntry("get_user_details", {"user_id": "mia_li_3668"}),  # data chain (read)
        ActionEntry("get_reservation_details", {"reservation_id": "ABC123"}),  # data chain (read)
    ]


def test_doc_worked_example_minus_0_04():
    res = score_prm_lite(doc_example_history(), seed_compat=True)
    assert [round(s.score, 10) for s in res.steps] == [0.01, 0.08, -0.02, 0.06, -0.03, -0.07, 0.09, 0.04, 0.04]
    assert res.mean_step_score == pytest.approx(0.2 / 9, abs=1e-9)
    assert {h.rule: round(h.weight, 10) for h in res.trajectory_hits} == {
        "no_reasoning": -0.05,
        "length_penalty": -0.01,
    }
    assert res.process == pytest.approx(-0.0377777777, abs=1e-6)
    assert round(res.process, 2) == -0.04


def test_turn_scores_sum_to_process():
    hist = [
        ActionEntry(e.tool, e.params, e.is_error, e.entities, e.content, turn=i // 2)
        for i, e in enumerate(doc_example_history())
    ]
    res = score_prm_lite(hist, seed_compat=True, num_turns=6)
    assert len(res.turn_scores) == 6
    assert sum(res.turn_scores) == pytest.approx(res.process, abs=1e-12)
    # Turn 0 holds entries 0 and 1: (0.01 + 0.08) / 9.
    assert res.turn_scores[0] == pytest.approx(0.09 / 9)
    assert res.turn_scores[5] == pytest.approx(res.process - 0.2 / 9, abs=1e-12)  # no entries + adjustments
