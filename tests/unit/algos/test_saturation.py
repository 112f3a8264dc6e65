"""Group-saturation diagnostics."""

from __future__ import annotations

import math

import pytest

from longhaul.algos.diagnostics import compute_group_saturation


def test_saturation_metrics():
    outcomes = [0, 0, 0, 1, 1, 1, 0, 1]
    index = ["a", "a", "a", "b", "b", "b", "c", "c"]
    process = [0.01, -0.02, 0.03, 0.0, 0.0, 0.0, 0.1, -0.1]
    scores = [o + 0.3 * p for o, p in zip(outcomes, process, strict=True)]
    m = compute_group_saturation(outcomes, index, scores, process)
    assert m["saturation/num_groups"] == 3
    assert m["saturation/frac_all_fail"] == pytest.approx(1 / 3)
    assert m["saturation/frac_all_success"] == pytest.approx(1 / 3)
    # Group a is saturated but its reward still varies through the process term; group b does not vary.
    assert m["saturation/frac_process_only_signal"] == pytest.approx(1 / 3)
    assert m["saturation/mean_group_std_outcome"] == pytest.approx(math.sqrt(0.5) / 3)
    assert m["saturation/process_spread"] == pytest.approx(0.2)
    std_a = 0.3 * math.sqrt(((0.01 - 0.02 / 3) ** 2 + (-0.02 - 0.02 / 3) ** 2 + (0.03 - 0.02 / 3) ** 2) / 2)
    std_c = math.sqrt(((1.0 + 0.03 * -1 - 0.5) ** 2 * 2) / 1)  # scores 0.03 and 0.97
    assert m["saturation/mean_group_std_score"] == pytest.approx((std_a + std_c) / 3)


def test_singletons_and_errors():
    m = compute_group_saturation([1.0], ["x"])
    assert m["saturation/frac_all_success"] == 1.0 and m["saturation/mean_group_std_outcome"] == 0.0
    assert compute_group_saturation([], []) == {"saturation/num_groups": 0.0}
    with pytest.raises(ValueError, match="same length"):
        compute_group_saturation([1.0, 0.0], ["x"])
