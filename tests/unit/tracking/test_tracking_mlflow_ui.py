"""MLflow as the place to look: experiments declare their kind, a local run directory holds its own artefacts,
the printed UI hint works from anywhere, and `longhaul compare` puts its table in the run's description.

Against a real sqlite store in tmp_path (one per module: creating a store's tables costs seconds here).
"""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.analysis.ablation import build_comparison_note
from longhaul.layout import MLFLOW_ARTIFACTS_SUBDIR
from longhaul.spec import load_spec, run_name
from longhaul.tracking.config import (
    build_ui_hint,
    local_artifact_location,
    local_store_uri,
)
from longhaul.tracking.runs import ensure_experiment, log_evaluation, start_or_resume_run

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """A smoke run started in its own run directory's sqlite store, from an unrelated working directory."""
    root = tmp_path_factory.mktemp("local")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    exp = load_spec(REPO / "specs" / "smoke.yaml")
    run_dir = root / "runs" / run_name(exp)
    uri = local_store_uri(run_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(elsewhere)
        tracked = start_or_resume_run(exp, uri, run_dir, "local", environ={})
    return exp, run_dir, uri, tracked, elsewhere


def test_a_new_experiment_declares_model_training(local_run):
    _, _, uri, tracked, _ = local_run
    tags = MlflowClient(uri).get_experiment(tracked.experiment_id).tags
    assert tags[T.EXPERIMENT_KIND] == T.EXPERIMENT_KIND_TRAINING == "custom_model_development"
    assert tags[T.KIND] == "family"


def test_local_artefacts_live_in_the_run_directory_not_the_working_directory(local_run):
    exp, run_dir, uri, tracked, elsewhere = local_run
    client = MlflowClient(uri)
    artifacts = run_dir / MLFLOW_ARTIFACTS_SUBDIR
    assert client.get_experiment(tracked.experiment_id).artifact_location == artifacts.as_uri()
    spec_copy = Path(client.get_run(tracked.run_id).info.artifact_uri.removeprefix("file://")) / "spec/experiment.yaml"
    assert spec_copy.is_file() and spec_copy.is_relative_to(artifacts)
    assert not (elsewhere / "mlruns").exists() and not any(elsewhere.iterdir())


def test_an_existing_longhaul_experiment_gets_the_kind_and_a_foreign_one_is_left_alone(local_run):
    _, _, uri, _, _ = local_run
    client = MlflowClient(uri)
    ours = client.create_experiment("longhaul/older", tags={T.KIND: "family"})
    foreign = client.create_experiment("someone-elses")
    assert ensure_experiment(client, "longhaul/older") == ours
    assert client.get_experiment(ours).tags[T.EXPERIMENT_KIND] == T.EXPERIMENT_KIND_TRAINING
    assert ensure_experiment(client, "someone-elses") == foreign
    assert T.EXPERIMENT_KIND not in client.get_experiment(foreign).tags


def test_compare_writes_its_table_into_the_comparison_runs_description(local_run, tmp_path):
    from longhaul.tracking.compare import TABLE_MD, write_comparison
    from support.tracking_runs import TASKS, TRIALS, build_summary

    exp, run_dir, uri, tracked, _ = local_run
    rng = random.Random(7)
    outcomes = [
        {"task_id": str(t), "trial": i, "success": rng.random() < 0.5, "subset": s, "subsets": [s], "num_turns": 3}
        for s, ts in TASKS.items()
        for t in ts
        for i in range(TRIALS)
    ]
    jsonl = tmp_path / "eval.jsonl"
    jsonl.write_text("".join(json.dumps(o) + "\n" for o in outcomes), encoding="utf-8")
    log_evaluation(tracked.run_id, 2, build_summary(outcomes, seed=2), jsonl, tracking_uri=uri)

    out = write_comparison(uri, ["smoke"], tmp_path / "cmp")
    client = MlflowClient(uri)
    run = client.get_run(out.run_id)
    note = run.data.tags[T.NOTE]
    table = (tmp_path / "cmp" / TABLE_MD).read_text(encoding="utf-8")
    assert table.strip() in note  # the whole table, readable on the run page
    assert f"`{run_name(exp)}`" in note and f"`{TABLE_MD}`" in note
    # The comparisons experiment is longhaul's too, and keeps its artefacts beside the store.
    cmp_exp = client.get_experiment(run.info.experiment_id)
    assert cmp_exp.tags[T.EXPERIMENT_KIND] == T.EXPERIMENT_KIND_TRAINING
    assert cmp_exp.artifact_location == local_artifact_location(uri)


def _table(rows: int) -> str:
    return "| run | step | pass^1 |\n|---|---:|---:|\n" + "".join(
        f"| run-{i:04d} | {i} | 0.500 |\n" for i in range(rows)
    )


def test_comparison_note_holds_table_and_statistics_when_they_fit():
    note = build_comparison_note(["a", "b"], _table(3), "\n## Statistics\n\nall good\n", files=["ablation.md"])
    assert note.startswith("**Ablation** over 2 training run(s): `a`, `b`\n\n| run | step | pass^1 |")
    assert "| run-0002 | 2 | 0.500 |" in note and "## Statistics" in note and note.endswith("`ablation.md`._\n")


def test_a_long_table_is_cut_at_a_row_and_says_how_many_rows_are_left_out():
    note = build_comparison_note(["a"], _table(500), "## Statistics", limit=2000, files=["ablation.md"])
    assert len(note) <= 2000
    body = [line for line in note.splitlines() if line.startswith("| run-")]
    assert body and all(line.endswith("| 0.500 |") for line in body)  # whole rows only
    assert f"_… {500 - len(body)} more row(s)._" in note
    assert "## Statistics" not in note and "`ablation.md`" in note


def test_ui_hint_for_a_local_store_is_an_absolute_command_and_a_runs_page(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hint = build_ui_hint("sqlite:///runs/my run/mlflow.db", "3")
    argv = shlex.split(hint.split("   then open ")[0])
    assert argv == ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{tmp_path}/runs/my run/mlflow.db"]
    assert hint.endswith(f"then open http://127.0.0.1:5000/#/experiments/3/runs?{T.UI_WORKFLOW_QUERY}")


def test_ui_hint_for_a_server_is_a_link_without_credentials():
    assert (
        build_ui_hint("https://bob:s3cr3t@mlflow.example:8443/", "5")
        == f"open https://mlflow.example:8443/#/experiments/5/runs?{T.UI_WORKFLOW_QUERY}"
    )
    assert "s3cr3t" not in build_ui_hint("postgresql://bob:s3cr3t@db/mlflow")


def test_only_sqlite_files_get_an_artefact_folder_beside_them(tmp_path):
    assert local_artifact_location(f"sqlite:///{tmp_path}/mlflow.db") == (tmp_path / "mlartifacts").as_uri()
    for other in ("http://mlflow:5000", "sqlite://", "sqlite:///:memory:", "file:///tmp/mlruns", "databricks"):
        assert local_artifact_location(other) is None
