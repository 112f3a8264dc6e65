"""Reward combination and the token layout of trajectory vs turn credit."""

from __future__ import annotations

import pytest
import torch

from longhaul.algos.estimators import compute_turn_credit
from longhaul.rewards.combine import (
    RewardBreakdown,
    build_token_rewards,
    combine_reward,
    turn_start_positions,
)
from longhaul.rewards.prm_lite import ActionEntry, score_prm_lite


def test_turn_start_positions():
    assert turn_start_positions([1, 1, 0, 0, 1, 0, 1, 1]) == [0, 4, 6]
    assert turn_start_positions([0, 0]) == []
    assert turn_start_positions([0, 1]) == [1]


def test_combine_outcome_plus_weighted_process():
    res = score_prm_lite(
        [
            ActionEntry("get_user_details", {"user_id": "a_b_1"}, turn=0),
            ActionEntry("transfer_to_human_agents", {"summary": "s"}, turn=1),
        ],
        num_turns=2,
    )
    r = combine_reward(1.0, res, weight=0.3)
    assert r.score == pytest.approx(1.0 + 0.3 * res.process)
    assert sum(r.turn_rewards) == pytest.approx(0.3 * res.process)
    assert combine_reward(0.0, None, 0.3) == RewardBreakdown(0.0, 0.0, 0.0, 0.0, ())


def decode(row, mask):
    """What the estimator reads back: (per-turn shares, trajectory-level reward), from a right-padded row."""
    pad = 3
    r = torch.tensor([row + [0.0] * pad], dtype=torch.float32)
    m = torch.tensor([list(mask) + [0] * pad])
    tc = compute_turn_credit(r, m, None)
    return tc.share.tolist(), float(tc.outcome[0])


def test_token_layout_trajectory_and_turn():
    r = RewardBreakdown(
        score=1.0 + 0.3 * 0.05, outcome=1.0, process=0.05, weight=0.3, turn_rewards=(0.3 * 0.02, 0.3 * 0.03)
    )
    mask = [1, 1, 0, 0, 1, 1, 0]
    traj = build_token_rewards(r, mask, "trajectory")
    assert traj == [0, 0, 0, 0, 0, 0, pytest.approx(r.score)]
    turn = build_token_rewards(r, mask, "turn")
    assert turn == [pytest.approx(0.006), 0, 0, 0, pytest.approx(0.009), 0, 1.0]
    assert sum(turn) == pytest.approx(r.score)
    # Fewer runs than scored turns (response cut): the extra shares go to the last run; the sum is kept.
    cut = build_token_rewards(r, [1, 1, 0], "turn")
    assert cut == [pytest.approx(0.015), 0.0, 1.0]
    assert build_token_rewards(r, [0, 0], "turn") == [0.0, pytest.approx(r.score)]
    with pytest.raises(ValueError, match="valid: trajectory, turn"):
        build_token_rewards(r, mask, "step")


@pytest.mark.parametrize(
    "mask",
    [
        [1, 1, 0, 0, 1, 1, 0],  # ends on a tool/user token
        [1, 1, 0, 1, 1],  # ends on the final assistant turn (the usual case)
        [1, 1, 0, 0, 1],  # final turn of one token at the last position: the outcome moves back one
        [0, 1, 0, 1],  # the same, response starting with a masked token
        [1, 0, 1, 0, 1, 0, 1],
        [1],  # a single token: only the sum survives (documented)
    ],
)
@pytest.mark.parametrize("outcome", [0.0, 1.0])
def test_turn_layout_decodes_exactly(mask, outcome):
    shares = (0.3 * 0.02, -0.3 * 0.05, 0.3 * 0.01, 0.3 * 0.04)
    runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    r = RewardBreakdown(
        score=outcome + sum(shares), outcome=outcome, process=sum(shares) / 0.3, weight=0.3, turn_rewards=shares
    )
    row = build_token_rewards(r, mask, "turn")
    assert len(row) == len(mask) and sum(row) == pytest.approx(r.score)
    q, o = decode(row, mask)
    if len(mask) == 1:
        assert q == pytest.approx([r.score]) and o == pytest.approx(0.0)
        return
    want = list(shares[: runs - 1]) + [sum(shares[runs - 1 :])]
    assert q == pytest.approx(want, abs=1e-7)
    assert o == pytest.approx(outcome, abs=1e-6)
    # The trajectory layout decodes as no per-turn shares (turn credit falls back to trajectory credit).
    if mask[-1] == 0 or mask[-2] == 1:
        q, o = decode(build_token_rewards(r, mask, "trajectory"), mask)
        assert q == [0.0] * runs and o == pytest.approx(r.score, abs=1e-6)
