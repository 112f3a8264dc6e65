"""Evaluation summaries (the real `compute_summary` document) → MLflow metric keys."""

from __future__ import annotations

import random

import pytest

from longhaul.analysis.evalmetrics import build_eval_metrics, headline_key, sanitize_key
from longhaul.eval.metrics import TrialRecord, compute_summary


def _summary(ks=(1, 2)):
    recs = []
    for t in range(6):
        subsets = ["train", "uncovered_seen"] if t < 4 else ["test", "unseen"]
        for trial in range(2):
            recs.append(
                TrialRecord(
                    str(t),
                    trial,
                    success=(t + trial) % 3 == 0,
                    subsets=tuple(subsets),
                    aborted=t == 5 and trial == 1,
                    num_tool_calls=3,
                    num_tool_errors=int(t == 1),
                )
            )
    return compute_summary(recs, ks, rng=random.Random(0), bootstrap_samples=50)


def test_real_summary_flattens_to_documented_keys():
    s = _summary()
    m = build_eval_metrics(s)
    assert m["eval/pass_hat_k/1"] == pytest.approx(s["pass_hat_k"]["1"])
    assert m["eval/pass_at_k/2"] == pytest.approx(s["pass_at_k"]["2"])
    assert m["eval/ci/pass_hat_k/1/lo"] == pytest.approx(s["ci"]["pass_hat_k"]["1"][0])
    assert m["eval/ci/pass_hat_k/1/hi"] == pytest.approx(s["ci"]["pass_hat_k"]["1"][1])
    assert m["eval/train/pass_hat_k/1"] == pytest.approx(s["subsets"]["train"]["pass_hat_k"]["1"])
    assert m["eval/unseen/ci/pass_at_k/2/hi"] == pytest.approx(s["subsets"]["unseen"]["ci"]["pass_at_k"]["2"][1])
    assert m["eval/generalisation_pass_hat_1"] == pytest.approx(s["generalisation_pass_hat_1"])
    assert m["eval/tool_error_rate"] == pytest.approx(s["tool_error_rate"])
    assert m["eval/abort_rate"] == pytest.approx(s["abort_rate"])
    # `k: [1, 2]` is a list of two numbers but not a CI; per_task rows and strings are not metrics.
    assert not any(k.startswith(("eval/k/", "eval/per_task")) for k in m)
    assert "eval/c_over_n" not in m and "eval/confidence" in m
    assert all("^" not in k and "@" not in k for k in m)


def test_wrappers_and_sanitising():
    m = build_eval_metrics(
        {
            "overall": {"pass^k": {"1": 0.5}},
            "metrics": {"avg@turns": 3},
            "per_subset": {"odd name!": {"pass_hat_k": {"1": 0.25}}},
            "flag": True,
            "nan": float("nan"),
            "none": None,
        }
    )
    assert m == {"eval/pass_hat_k/1": 0.5, "eval/avg_at_turns": 3.0, "eval/odd name_/pass_hat_k/1": 0.25}
    assert sanitize_key("pass^4") == "pass_hat_4"
    assert headline_key("pass_at_k", 4, "test") == "eval/test/pass_at_k/4"
