"""pass^k / pass@k, subsets, generalisation, CIs and rates (method.md d, e, h.7, h.8)."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from longhaul.eval.metrics import (
    TaskCount,
    TrialRecord,
    bootstrap_ci,
    build_task_counts,
    compute_generalisation,
    compute_rate,
    compute_summary,
    pass_at_k,
    pass_hat_k,
)


def test_method_md_example_n8_c4():
    assert pass_hat_k(4, 8, 1) == 0.5 == pass_at_k(4, 8, 1)
    assert pass_hat_k(4, 8, 4) == pytest.approx(1 / 70)
    assert pass_at_k(4, 8, 4) == pytest.approx(69 / 70)


def test_extremes_and_argument_checks():
    assert pass_hat_k(8, 8, 8) == 1.0 and pass_at_k(0, 8, 8) == 0.0
    assert pass_hat_k(3, 8, 4) == 0.0  # fewer successes than k
    assert pass_at_k(5, 8, 4) == 1.0  # fewer failures than k
    with pytest.raises(ValueError, match="1 ≤ k ≤ n"):
        pass_hat_k(2, 4, 5)
    with pytest.raises(ValueError, match="within 0..n"):
        pass_at_k(5, 4, 1)


def test_macro_average_over_tasks_by_hand():
    counts = [TaskCount("a", 4, 0), TaskCount("b", 4, 2), TaskCount("c", 4, 4)]
    # pass^2: (0 + 1/6 + 1)/3 = 7/18 ; pass@2: (0 + 5/6 + 1)/3 = 11/18
    assert compute_rate(counts, 2, "pass_hat") == pytest.approx(float(Fraction(7, 18)))
    assert compute_rate(counts, 2, "pass_at") == pytest.approx(float(Fraction(11, 18)))
    assert compute_rate(counts, 1, "pass_hat") == pytest.approx(0.5)


def _records(spec: dict[str, tuple[int, int, list[str]]]) -> list[TrialRecord]:
    out = []
    for tid, (n, c, subsets) in spec.items():
        for t in range(n):
            out.append(
                TrialRecord(
                    tid,
                    t,
                    t < c,
                    tuple(subsets),
                    aborted=t >= c and t % 2 == 0,
                    termination="x",
                    num_tool_calls=3,
                    num_tool_errors=1 if t == 0 else 0,
                    num_turns=4,
                )
            )
    return out


def test_summary_subsets_generalisation_and_rates():
    recs = _records(
        {
            "1": (4, 4, ["covered_seen", "train"]),
            "2": (4, 1, ["uncovered_seen", "train"]),
            "3": (4, 2, ["uncovered_seen", "train"]),
            "4": (4, 0, ["unseen", "test"]),
        }
    )
    s = compute_summary(recs, [1, 2, 4], rng=random.Random(0), bootstrap_samples=200)
    assert s["c_over_n"] == "7/16" and s["tasks"] == 4 and s["trials"] == 16
    assert s["pass_hat_k"]["1"] == pytest.approx((1 + 0.25 + 0.5 + 0) / 4)
    assert s["pass_hat_k"]["4"] == pytest.approx(0.25)
    assert s["pass_at_k"]["4"] == pytest.approx(0.75)
    unc = s["subsets"]["uncovered_seen"]
    assert unc["c_over_n"] == "3/8" and unc["pass_hat_k"]["1"] == pytest.approx(0.375)
    assert s["subsets"]["unseen"]["pass_hat_k"]["1"] == 0.0
    assert s["generalisation_pass_hat_1"] == pytest.approx((0.375 * 24 + 0.0 * 10) / 34)
    # tool errors are errors / tool calls; aborts are trials — two different rates
    assert s["tool_calls"] == 48 and s["tool_errors"] == 4 and s["tool_error_rate"] == pytest.approx(4 / 48)
    assert s["aborted_trials"] == 4 and s["abort_rate"] == pytest.approx(4 / 16)
    lo, hi = s["ci"]["pass_hat_k"]["1"]
    assert lo <= s["pass_hat_k"]["1"] <= hi
    assert set(s["pass_hat_k"]) == {"1", "2", "4"} == set(s["pass_at_k"])


def test_null_floor_is_reported_per_block():
    recs = _records({"1": (2, 1, ["train"]), "2": (2, 2, ["test"])})
    s = compute_summary(recs, [1], null_floor={"1": 1.0, "2": 0.0})
    assert s["null_agent_floor"] == 0.5 and s["subsets"]["train"]["null_agent_floor"] == 1.0
    assert s["ci"] == {}


def test_generalisation_needs_both_subsets():
    assert compute_generalisation([TaskCount("1", 2, 1, ("train",))]) is None


def test_bootstrap_is_seeded_and_degenerate_cases():
    counts = [TaskCount(str(i), 4, i % 5) for i in range(20)]
    a = bootstrap_ci(counts, 1, "pass_hat", random.Random(3), 300)
    b = bootstrap_ci(counts, 1, "pass_hat", random.Random(3), 300)
    assert a == b and a[0] < a[1]
    same = [TaskCount(str(i), 4, 4) for i in range(5)]
    assert bootstrap_ci(same, 2, "pass_at", random.Random(0), 50) == (1.0, 1.0)


def test_k_larger_than_n_and_bad_records_are_refused():
    recs = _records({"1": (2, 1, []), "2": (4, 1, [])})
    with pytest.raises(ValueError, match="k=\\[4\\] exceeds"):
        compute_summary(recs, [1, 4])
    with pytest.raises(ValueError, match="duplicate record"):
        build_task_counts([TrialRecord("1", 0, True), TrialRecord("1", 0, False)])
    with pytest.raises(KeyError, match="missing 'success'"):
        TrialRecord.from_dict({"task_id": "1", "trial": 0})
    r = TrialRecord.from_dict({"task_id": 7, "trial": 1, "success": True, "subset": "unseen"})
    assert r.task_id == "7" and r.trial == 1 and r.success and r.subsets == ("unseen",)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"success": "false"}, "'success' must be true or false"),  # bool("false") would count a success
        ({"success": 1}, "'success' must be true or false"),
        ({"trial": "1"}, "'trial' must be an integer ≥ 0"),
        ({"trial": -1}, "'trial' must be an integer ≥ 0"),
        ({"trial": 1.5}, "'trial' must be an integer ≥ 0"),
        ({"trial": True}, "'trial' must be an integer ≥ 0"),
        ({"subset": 3}, "'subset(s)' must be a string or a list of strings"),
        ({"subsets": ["train", 2]}, "'subset(s)' must be a string or a list of strings"),
        ({"task_id": None}, "'task_id' must be a string or an integer"),
        ({"task_id": [1]}, "'task_id' must be a string or an integer"),
        ({"aborted": "no"}, "'aborted' must be true or false"),
        ({"num_turns": -3}, "'num_turns' must be an integer ≥ 0"),
        ({"seed": "7"}, "'seed' must be an integer"),
    ],
)
def test_a_record_of_the_wrong_type_is_refused_never_coerced(change, field):
    rec = {"task_id": "1", "trial": 0, "success": False, "subset": "train", **change}
    with pytest.raises(ValueError, match=re.escape(field)):
        TrialRecord.from_dict(rec)


def test_eval_summarize_names_the_file_line_and_field(tmp_path):
    from typer.testing import CliRunner

    from longhaul.cli import app

    path = tmp_path / "results.jsonl"
    path.write_text('{"task_id": "1", "trial": 0, "success": true, "subset": "train"}\n'
                    '{"task_id": "1", "trial": 1, "success": "false", "subset": "train"}\n')  # fmt: skip
    res = CliRunner().invoke(app, ["eval", "summarize", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{path}:2" in res.output and "'success' must be true or false" in res.output, res.output


def test_unscored_trials_leave_their_task_out_of_every_rate():
    """An endpoint failure is the harness's, not the agent's: the task is neither a failure nor rated on fewer
    trials; it is listed."""
    recs = _records({"1": (4, 4, ["train"]), "2": (4, 0, ["train"]), "3": (4, 2, ["test"])})
    unscored = TrialRecord.from_dict(
        {
            "task_id": "2",
            "trial": 4,
            "success": False,
            "subsets": ["train"],
            "termination": "endpoint_error",
            "scored": False,
        }
    )
    s = compute_summary([*recs, unscored], [1, 4])
    assert s["tasks"] == 2 and s["trials"] == 8 and s["c_over_n"] == "6/8"
    assert s["pass_hat_k"]["1"] == pytest.approx((1 + 0.5) / 2)
    assert s["subsets"]["train"]["tasks"] == 1 and s["subsets"]["train"]["pass_hat_k"]["1"] == 1.0
    assert s["unscored_trials"] == 1 and s["incomplete_tasks"] == ["2"]
    assert "endpoint_error" not in s["terminations"] and sum(s["terminations"].values()) == 8
    assert [t.task_id for t in build_task_counts([*recs, unscored])] == ["1", "3"]
    assert compute_summary(recs, [1])["unscored_trials"] == 0  # records written before the field: scored
    with pytest.raises(ValueError, match="no task has all its trials scored"):
        compute_summary([unscored], [1])
