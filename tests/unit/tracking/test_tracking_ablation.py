"""The ablation table and figures from literal run records (no MLflow)."""

from __future__ import annotations

import csv
import io

from longhaul.analysis import tags as T
from longhaul.analysis.ablation import (
    EvalPoint,
    RunRecord,
    build_rows,
    discover_subsets,
    render_csv,
    render_markdown,
    select_point,
)
from longhaul.analysis.figures import build_comparison_figure, build_progression_figure


def point(step, overall, train, test, gen=None, **extra):
    m = {
        "eval/pass_hat_k/1": overall,
        "eval/train/pass_hat_k/1": train,
        "eval/test/pass_hat_k/1": test,
        "eval/pass_hat_k/2": overall / 2,
        "eval/pass_at_k/2": min(1.0, overall * 1.5),
        "eval/ci/pass_hat_k/1/lo": overall - 0.05,
        "eval/ci/pass_hat_k/1/hi": overall + 0.05,
        **extra,
    }
    if gen is not None:
        m["eval/generalisation_pass_hat_1"] = gen
    return EvalPoint(step, m, f"e{step}")


def record(name, adv, proc, points, select_on="train"):
    tags = {T.SPEC_NAME: name, T.ADVANTAGE: adv, T.PROCESS_REWARD: proc, T.SELECT_ON: select_on}
    return RunRecord(f"longhaul/{name}", f"id-{name}", f"{name}-0123abcd", tags, tuple(points))


RECORDS = [
    record("vanilla", "grpo", "none", [point(50, 0.22, 0.30, 0.10), point(100, 0.20, 0.25, 0.40)]),
    record("joint", "lata", "prm_lite", [point(200, 0.21, 0.40, 0.10, 0.1), point(250, 0.24, 0.40, 0.2, 0.11)]),
]


def test_selection_uses_select_on_never_test_and_ties_go_to_the_earlier_step():
    assert select_point(RECORDS[0]).step == 50  # train 0.30 beats 0.25 although test is higher at 100
    assert select_point(RECORDS[1]).step == 200  # tie on train → earlier step
    no_subset = record(
        "x", "grpo", "none", [EvalPoint(1, {"eval/pass_hat_k/1": 0.1}), EvalPoint(2, {"eval/pass_hat_k/1": 0.3})]
    )
    assert select_point(no_subset) is None  # never the overall pass^1: it includes the test tasks
    assert select_point(record("y", "grpo", "none", [])) is None
    # 'unseen' is the test split under another name (the spec accepts it): nothing is selected.
    unseen = {"eval/unseen/pass_hat_k/1": 0.1}
    on_unseen = record(
        "u",
        "grpo",
        "none",
        [point(50, 0.2, 0.3, 0.1, **unseen), point(60, 0.2, 0.3, 0.2, **unseen)],
        select_on="unseen",
    )
    assert select_point(on_unseen) is None


def test_rows_columns_markdown_and_csv():
    cols, rows = build_rows(RECORDS)
    keys = [c.key for c in cols]
    assert keys[:4] == ["experiment", "run", "method", "step"]
    assert {
        "pass_hat_1",
        "train_pass_hat_1",
        "test_pass_hat_1",
        "generalisation_pass_hat_1",
        "pass_hat_2",
        "pass_at_2",
        "selected",
    } <= set(keys)
    assert "tool_error_rate" not in keys  # not logged by any record → no empty column
    assert [(r["run"], r["step"], r["selected"]) for r in rows] == [
        ("joint-0123abcd", 200, "yes"),
        ("joint-0123abcd", 250, ""),
        ("vanilla-0123abcd", 50, "yes"),
        ("vanilla-0123abcd", 100, ""),
    ]
    assert rows[0]["method"] == "lata + prm_lite" and rows[2]["method"] == "grpo"
    md = render_markdown(cols, rows)
    lines = md.strip().splitlines()
    assert len(lines) == 2 + len(rows)
    assert "| pass^1 |" in lines[0] and "| 0.240 |" in lines[3]
    assert "| — |" in lines[4]  # vanilla has no generalisation value
    parsed = list(csv.DictReader(io.StringIO(render_csv(cols, rows))))
    assert float(parsed[1]["pass_hat_1"]) == 0.24 and parsed[2]["generalisation_pass_hat_1"] == ""


def test_subset_discovery_order():
    assert discover_subsets(RECORDS) == ["train", "test", "generalisation"]


def test_figures_render_to_png():
    for fig in (build_comparison_figure(RECORDS), build_progression_figure(RECORDS)):
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n" and len(buf.getvalue()) > 10_000
