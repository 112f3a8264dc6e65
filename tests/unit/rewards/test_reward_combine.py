"""Reward combination and the token layout of trajectory vs turn credit."""

from __future__ import annotations

import pytest

from longhaul.rewards.combine import RewardBreakdown, build_token_rewards, combine_reward, turn_end_positions
from longhaul.rewards.prm_lite import ActionEntry, score_prm_lite


def test_turn_end_positions():
    assert turn_end_positions([1, 1, 0, 0, 1, 0, 1, 1]) == [1, 4, 7]
    assert turn_end_positions([0, 0]) == []
    assert turn_end_positions([1]) == [0]


def test_combine_outcome_plus_weighted_process():
    res = score_prm_lite([ActionEntry("get_user_details", {"user_id": "a_b_1"}, turn=0),
                          ActionEntry("transfer_to_human_agents", {"summary": "s"}, turn=1)], num_turns=2)
    r = combine_reward(1.0, res, weight=0.3)
    assert r.score == pytest.approx(1.0 + 0.3 * res.process)
    assert sum(r.turn_rewards) == pytest.approx(0.3 * res.process)
    assert combine_reward(0.0, None, 0.3) == RewardBreakdown(0.0, 0.0, 0.0, 0.0, ())


def test_token_layout_trajectory_and_turn():
    r = RewardBreakdown(score=1.0 + 0.3 * 0.05, outcome=1.0, process=0.05, weight=0.3, turn_rewards=(0.3 * 0.02, 0.3 * 0.03))
    mask = [1, 1, 0, 0, 1, 1, 0]
    traj = build_token_rewards(r, mask, "trajectory")
    assert traj == [0, 0, 0, 0, 0, 0, pytest.approx(r.score)]
    turn = build_token_rewards(r, mask, "turn")
    assert turn[1] == pytest.approx(0.006) and turn[5] == pytest.approx(0.009) and turn[6] == 1.0
    assert sum(turn) == pytest.approx(r.score)
    # Fewer runs than scored turns (response cut): the extra shares go to the last run; the sum is kept.
    cut = build_token_rewards(r, [1, 1, 0], "turn")
    assert cut == [0.0, pytest.approx(0.015), 1.0]
    assert build_token_rewards(r, [0, 0], "turn") == [0.0, pytest.approx(r.score)]
    with pytest.raises(ValueError, match="valid: trajectory, turn"):
        build_token_rewards(r, mask, "step")
