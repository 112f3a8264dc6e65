"""The learning curve (`longhaul.eval.curve`): training-step metrics from rollout-trace lines, evaluation points
from real evaluation summaries (`summarize_evaluation` on trial records), joined by step."""

from __future__ import annotations

import pytest

from longhaul.eval.curve import (
    TRAIN_EPISODES,
    TRAIN_OUTCOME,
    TRAIN_REWARD,
    build_learning_curve,
    format_subset,
    format_terminations,
    subset_floors,
    training_step_metrics,
)
from longhaul.eval.evaluate import summarize_evaluation


def _line(outcome: float | None, score: float | None, termination: str | None) -> dict:
    reward = {k: v for k, v in (("outcome", outcome), ("score", score)) if v is not None}
    return {"reward": reward, "termination": termination, "trajectory": {"turns": []}}


def test_training_step_metrics_average_what_the_episodes_trained_with_and_count_their_endings():
    lines = [
        _line(1.0, 1.06, "user_stop"),
        _line(0.0, -0.03, "max_turns"),
        _line(0.0, 0.0, "user_stop"),
        _line(None, None, None),  # a record without a reward (written before grading): counted, not averaged
    ]
    m = training_step_metrics(lines)
    assert m[TRAIN_EPISODES] == 4
    assert m[TRAIN_OUTCOME] == pytest.approx(1 / 3)
    assert m[TRAIN_REWARD] == pytest.approx((1.06 - 0.03) / 3)
    assert m["train/terminations/user_stop"] == 2 and m["train/terminations/max_turns"] == 1
    assert m["train/terminations/unknown"] == 1
    assert training_step_metrics([]) == {TRAIN_EPISODES: 0.0}


def _records(successes: dict[str, list[bool]], ends: dict[str, list[str]]) -> list[dict]:
    return [
        {
            "task_id": tid,
            "trial": i,
            "success": ok,
            "reward": float(ok),
            "scored": True,
            "subset": "train" if tid in ("0", "1") else "test",
            "subsets": ["train"] if tid in ("0", "1") else ["test"],
            "termination": ends[tid][i],
            "num_turns": 2,
        }
        for tid, oks in successes.items()
        for i, ok in enumerate(oks)
    ]


def test_the_curve_joins_training_steps_and_evaluated_checkpoints_by_step():
    # Tasks 0 and 1 (train) and 3 (test): a do-nothing agent passes 0 and 1, fails 3 (null-agent floor).
    step0 = summarize_evaluation(
        _records(
            {"0": [False, False], "1": [True, False], "3": [False, False]},
            {"0": ["max_turns"] * 2, "1": ["user_stop", "max_turns"], "3": ["max_turns"] * 2},
        ),
        [1],
        bootstrap=0,
        confidence=0.95,
        seed=0,
    )
    step2 = summarize_evaluation(
        _records(
            {"0": [True, True], "1": [True, False], "3": [False, False]},
            {"0": ["user_stop"] * 2, "1": ["user_stop"] * 2, "3": ["user_stop", "max_turns"]},
        ),
        [1],
        bootstrap=0,
        confidence=0.95,
        seed=0,
    )
    train = {
        1: training_step_metrics([_line(0.0, 0.01, "max_turns"), _line(1.0, 1.02, "user_stop")]),
        2: training_step_metrics([_line(1.0, 1.0, "user_stop")] * 2),
    }
    points = build_learning_curve(train, {0: step0, 2: step2}, ["train", "test", "unseen"])
    assert [p.step for p in points] == [0, 1, 2]
    first, middle, last = points
    # Step 0: evaluated, never trained.
    assert first.reward is None and first.outcome is None and first.train_terminations == {}
    assert format_subset(first.subsets["train"]) == "0.250 (1/4)" and format_subset(first.subsets["test"]) == (
        "0.000 (0/2)"
    )
    assert first.eval_terminations == {"max_turns": 5, "user_stop": 1}
    # Step 1: trained, not evaluated.
    assert middle.outcome == 0.5 and middle.reward == pytest.approx(0.515) and middle.subsets == {}
    assert format_subset(middle.subsets.get("train")) == "-"
    # Step 2: both.
    assert last.outcome == 1.0 and last.train_terminations == {"user_stop": 2}
    assert last.subsets["train"].pass_hat_1 == 0.75 and (
        last.subsets["train"].successes,
        last.subsets["train"].trials,
    ) == (3, 4)
    assert "unseen" not in last.subsets  # no such subset in these records
    assert subset_floors(points) == {"train": 1.0, "test": 0.0}
    assert format_terminations(last.eval_terminations) == "user_stop 5/6, max_turns 1/6"
    assert format_terminations({}) == ""
