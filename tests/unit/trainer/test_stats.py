from longhaul.trainer.stats import compute_zero_signal_fraction, summarize


def test_zero_signal_fraction_counts_groups_with_equal_rewards():
    ids = ["1", "1", "2", "2", "3", "3"]
    assert compute_zero_signal_fraction(ids, [1.2, 1.2, 0.1, -0.3, 0.0, 0.0]) == 2 / 3
    assert compute_zero_signal_fraction(ids, [1, 0, 0.1, -0.3, 0.0, 0.5]) == 0.0
    assert compute_zero_signal_fraction([], []) == 0.0


def test_summarize():
    assert summarize([1, 2, 3], "x") == {"x/mean": 2.0, "x/min": 1.0, "x/max": 3.0}
    assert summarize([], "x") == {}
