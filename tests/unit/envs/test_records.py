"""Trajectory records read back from files are type-checked and bounded before anything is computed from them."""

from __future__ import annotations

import pytest

from longhaul.envs.records import check_trajectory_record
from longhaul.spec.bounds import MAX_TURNS

GOOD = {
    "task_id": "1",
    "trial": 0,
    "termination": "user_stop",
    "grade": {"success": True},
    "turns": [
        {"index": 0, "content": "x", "tool_calls": [{"name": "get_user_details", "arguments": {"user_id": "a_b_1"}}]},
        {"index": 1, "content": None, "to_user": True, "completion_tokens": 3, "policy_version": [4, 5]},
    ],
}


def test_a_runner_record_passes() -> None:
    check_trajectory_record(GOOD)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"turns": "abc"}, "turns: must be a list"),
        ({"turns": [1]}, "turns[0]: must be an object"),
        ({"turns": [{"content": "x"}]}, "turns[0].index: missing"),
        ({"turns": [{"index": True}]}, "turns[0].index: must be an integer"),
        ({"turns": [{"index": 0, "completion_tokens": "9"}]}, "turns[0].completion_tokens: must be an integer"),
        ({"turns": [{"index": 0, "completion_tokens": -1}]}, "is negative"),
        ({"turns": [{"index": 0, "completion_tokens": 10**15}]}, "past 4,194,304 tokens"),
        ({"turns": [{"index": 0, "tool_calls": [{"name": 5}]}]}, "turns[0].tool_calls[0].name: must be a string"),
        ({"turns": [{"index": 0, "tool_calls": [{"name": "x", "arguments": [1]}]}]}, "arguments: must be an object"),
        ({"grade": "yes"}, "grade: must be an object"),
        ({"grade": {"success": "false"}}, "grade.success: must be true or false"),
        ({"task_id": 1.5}, "task_id: must be a string or an integer"),
        ({"turns": [{"index": k} for k in range(MAX_TURNS + 1)]}, "1,001 turns"),
        ({"turns": [{"index": 0, "policy_version": 4}]}, "turns[0].policy_version: must be a list"),
        ({"turns": [{"index": 0, "policy_version": [4]}]}, "turns[0].policy_version: must be [first, last]"),
        ({"turns": [{"index": 0, "policy_version": [5, 4]}]}, "first ≤ last"),
        ({"turns": [{"index": 0, "policy_version": [4, "5"]}]}, "two step numbers"),
        ({"turns": [{"index": 0, "policy_version": [True, 1]}]}, "two step numbers"),
        ({"turns": [{"index": 0, "policy_version": [-1, 1]}]}, "two step numbers"),
    ],
)
def test_wrong_types_and_sizes_name_the_field(change: dict, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        check_trajectory_record({**GOOD, **change})
    assert fragment in str(info.value)
