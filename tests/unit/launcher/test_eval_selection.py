"""The eval stage selects the best checkpoint on `select_on` (never on test), prints it and records it on the
training run. Every checkpoint here is already evaluated (its summary.json exists), so the stage only reads
them: no policy server, simulator or merge is needed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from longhaul.analysis import tags as T
from longhaul.launcher import evaluate
from longhaul.launcher.context import StageResults
from longhaul.layout import Paths
from longhaul.spec import load_spec
from unit.tracking.test_tracking_selection import SUMMARIES  # train ties at steps 1 and 2; test best at 2

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def stage(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    eval_dir = tmp_path / "eval"
    for step, s in SUMMARIES.items():
        (eval_dir / f"step_{step}").mkdir(parents=True)
        (eval_dir / f"step_{step}" / "summary.json").write_text(json.dumps({**s, "checkpoint_step": step}))
    monkeypatch.setattr(evaluate, "saved_steps", lambda _dir: [1, 2])

    def run(select_on: str):
        doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
        # Validation refuses subsets holding test tasks; 'unseen' is set past it to test the stage's own guard.
        doc["spec"]["evaluation"]["select_on"] = "train" if select_on == "unseen" else select_on
        path = tmp_path / f"smoke-{select_on}.yaml"
        path.write_text(yaml.safe_dump(doc))
        exp = load_spec(path)
        if select_on == "unseen":
            evaluation = exp.spec.evaluation.model_copy(update={"select_on": "unseen"})
            exp = exp.model_copy(update={"spec": exp.spec.model_copy(update={"evaluation": evaluation})})
        run_id = client.create_run(client.create_experiment(select_on)).info.run_id
        ctx = SimpleNamespace(
            exp=exp,
            control=SimpleNamespace(requested=False),
            echo=io.StringIO(),
            checkpoint_dir=tmp_path / "checkpoints",
            paths=Paths.under(str(tmp_path)),  # eval_dir: tmp_path / eval
            policy_server=lambda: SimpleNamespace(serving="base"),
            results=StageResults(),
            run_id=run_id,
            tracking_uri=uri,
        )
        evaluate.run_eval_stage(ctx)
        return ctx, client.get_run(run_id), client

    return run


def test_eval_stage_selects_on_train_prints_and_tags_the_training_run(stage):
    ctx, run, client = stage("train")
    out = ctx.echo.getvalue()
    assert "[eval] selected step 1 on train: pass^1 0.500 (best of 3 checkpoints" in out
    assert run.data.tags[T.SELECT_ON] == "train"
    assert run.data.tags[T.SELECTED_STEP] == "1"
    assert float(run.data.tags[T.SELECTED_PASS_HAT_1]) == 0.5
    [m] = client.get_metric_history(run.info.run_id, T.SELECTED_PASS_HAT_1_METRIC)
    assert (m.step, m.value) == (1, 0.5)
    assert sorted(ctx.results.eval_summaries) == [0, 1, 2]
    assert ctx.results.selection == {"select_on": "train", "step": 1, "pass^1": 0.5}
    # The end-of-run learning curve marks the selected checkpoint and shows pass^1 (c/n) per subset.
    rows = _curve_rows(ctx)
    assert [(r[0], r[-1]) for r in rows] == [("0", ""), ("1", "yes"), ("2", "")]


def _curve_rows(ctx) -> list[list[str]]:
    """The learning-curve table's rows (cells as text) for the stage's results, without training metrics."""
    from longhaul.launcher.summary import learning_curve_table

    table = learning_curve_table(ctx, {})
    cells = [[str(c) for c in col.cells] for col in table.columns]
    return [list(row) for row in zip(*cells, strict=True)]


def test_eval_stage_refuses_to_select_on_unseen_the_test_split_by_another_name(stage):
    ctx, run, _ = stage("unseen")  # validation refuses it too; the stage guards on its own (defence in depth)
    out = ctx.echo.getvalue()
    assert "warning: select_on 'unseen' is the test split" in out
    assert "[eval] no checkpoint selected on unseen" in out
    assert T.SELECTED_STEP not in run.data.tags and "test split" in run.data.tags[T.SELECTION_NOTE]
    assert ctx.results.selection is None
    assert all(r[-1] == "" for r in _curve_rows(ctx))
