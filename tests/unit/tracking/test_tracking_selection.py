"""Checkpoint selection never on test (issue 14, item 5): the pure rule, the split check, the tags and the MLflow
call that records them on the training run."""

from __future__ import annotations

import pytest

from longhaul.analysis import tags as T
from longhaul.analysis.selection import (
    Selection,
    build_selection,
    build_selection_message,
    build_selection_tags,
    check_select_on,
    compute_subset_pass_hat_1,
    select_checkpoint,
)
from longhaul.envs.airline.splits import build_explicit, build_seed_40_10
from longhaul.eval.metrics import TrialRecord, compute_summary

TRAIN, TEST = ["0", "1", "2", "4"], ["3", "10"]


def summary(train_wins: int, test_wins: int, ks=(1, 2)) -> dict:
    """A real `compute_summary` document: 2 trials per task; `train_wins` / `test_wins` tasks succeed twice."""
    recs = []
    for ids, wins, subsets in ((TRAIN, train_wins, ("train",)), (TEST, test_wins, ("test", "unseen"))):
        for i, tid in enumerate(ids):
            recs += [TrialRecord(tid, t, i < wins, subsets) for t in range(2)]
    return compute_summary(recs, list(ks))


#: Step 2 has the best test and overall pass^1, steps 1 and 2 tie on train.
SUMMARIES = {0: summary(1, 0), 1: summary(2, 0), 2: summary(2, 2)}


def test_selects_on_the_subset_ties_to_the_earliest_step_never_on_test_or_overall():
    sel = build_selection(SUMMARIES, "train")
    assert sel == Selection("train", 1, 0.5, 3)
    assert SUMMARIES[2]["pass_hat_k"]["1"] > SUMMARIES[1]["pass_hat_k"]["1"]  # overall would pick step 2
    for bad in ("test", "unseen"):
        with pytest.raises(ValueError, match="never selected"):
            build_selection(SUMMARIES, bad)


def test_select_checkpoint_rule():
    assert select_checkpoint({300: 0.4, 100: 0.4, 200: 0.3}, "train") == Selection("train", 100, 0.4, 3)
    assert select_checkpoint({0: 0.1, 50: None}, "train") == Selection("train", 0, 0.1, 1)
    assert select_checkpoint({50: None}, "train") is None
    assert select_checkpoint({}, "covered_seen") is None


def test_subset_pass_hat_1_logged_or_from_per_task():
    s = summary(3, 0)
    assert compute_subset_pass_hat_1(s, "train") == 0.75
    no_k1 = summary(3, 0, ks=(2,))
    assert "1" not in no_k1["subsets"]["train"]["pass_hat_k"]
    assert compute_subset_pass_hat_1(no_k1, "train") == 0.75
    assert compute_subset_pass_hat_1(s, "covered_seen") is None
    assert build_selection({1: s, 2: s}, "covered_seen") is None


def test_check_select_on_refuses_test_tasks_under_any_name():
    seed = build_seed_40_10()
    assert check_select_on("train", seed.subsets, seed.test) is None
    assert check_select_on("covered_seen", seed.subsets, seed.test) is None
    assert "test split" in check_select_on("test", seed.subsets, seed.test)
    assert "test split" in check_select_on("unseen", seed.subsets, seed.test)  # the spec accepts it
    assert seed.subsets["unseen"] == seed.test
    plain = build_explicit([0, 1], [3])
    assert "not a subset" in check_select_on("covered_seen", plain.subsets, plain.test)
    leaky = build_explicit([0, 1], [3], covered_seen=[0, 3])
    assert "contains test tasks ['3']" in check_select_on("covered_seen", leaky.subsets, leaky.test)


def test_tags_and_console_line():
    sel = Selection("train", 100, 0.4375, 3)
    assert build_selection_tags("train", sel) == {
        T.SELECT_ON: "train",
        T.SELECTED_STEP: "100",
        T.SELECTED_PASS_HAT_1: "0.4375",
    }
    assert build_selection_tags("unseen", None, "why") == {T.SELECT_ON: "unseen", T.SELECTION_NOTE: "why"}
    line = build_selection_message(sel, "train")
    assert line.startswith("selected step 100 on train: pass^1 0.438 (best of 3 checkpoints")
    assert build_selection_message(None, "unseen", "why") == "no checkpoint selected on unseen: why"


def test_log_selection_records_tags_and_metric_on_the_training_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from longhaul.tracking.runs import log_selection

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    log_selection(client, run_id, "train", Selection("train", 100, 0.4375, 3))
    run = client.get_run(run_id)
    assert run.data.tags[T.SELECT_ON] == "train" and run.data.tags[T.SELECTED_STEP] == "100"
    assert float(run.data.tags[T.SELECTED_PASS_HAT_1]) == 0.4375
    [m] = client.get_metric_history(run_id, T.SELECTED_PASS_HAT_1_METRIC)
    assert (m.step, m.value) == (100, 0.4375)
    # Nothing selectable later (same run): the stale step goes, a note says why.
    log_selection(client, run_id, "unseen", None, "select_on 'unseen' is the test split")
    tags = client.get_run(run_id).data.tags
    assert T.SELECTED_STEP not in tags and T.SELECTED_PASS_HAT_1 not in tags
    assert tags[T.SELECT_ON] == "unseen" and "test split" in tags[T.SELECTION_NOTE]
