from longhaul.trainer.stats import compute_group_saturation, summarize


def test_group_saturation_fractions():
    ids = ["1", "1", "2", "2", "3", "3"]
    scores = [1.2, 1.2, 0.1, -0.3, 0.0, 0.0]
    outcomes = [1, 1, 0, 0, 0, 0]
    s = compute_group_saturation(ids, scores, outcomes)
    assert s["train/saturated_group_fraction"] == 2 / 3
    assert s["train/groups_all_success_fraction"] == 1 / 3
    assert s["train/groups_all_fail_fraction"] == 2 / 3
    assert s["train/groups"] == 3


def test_summarize():
    assert summarize([1, 2, 3], "x") == {"x/mean": 2.0, "x/min": 1.0, "x/max": 3.0}
    assert summarize([], "x") == {}
