"""CI's one smoke run as a seed group with LoRA (`smoke_group`, tests/e2e/demo/conftest.py): metrics, tags,
artifacts and parent/child links read back from the group's MLflow store, `longhaul compare` over the seeds, and the
LoRA path of a GPU spec — adapters trained through `main_ppo`, synced into veRL's vLLM rollout after every update,
checkpoints merged (veRL's merger, then the adapter merge) and evaluated.

veRL's own MLflow logger and longhaul's tracking write into the same runs, under one parent run for the seed group.
(The same writes through a real `mlflow server`, and the relay's behaviour when that server is down or slow:
tests/e2e/mlflow/test_mlflow_tracking.py and tests/reliability/test_tracking_faults.py.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.eval import stats
from longhaul.spec import experiment_family, run_name, spec_hash
from longhaul.tracking.runs import fetch_eval_runs
from support.vllm_sync_probe import read_sync_log, weights_sum

from .conftest import SEEDS

pytestmark = [pytest.mark.mlflow, pytest.mark.demo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ns(smoke_group):
    """The group run, with a client of its store and its number of steps (the shared fixture itself is left as
    the other module reads it); fails when the run failed."""
    assert smoke_group.rc == 0, smoke_group.out[-6000:]
    for d in smoke_group.run_dirs:
        assert not (d / "mlflow.db").exists(), "a seed run opened a store of its own instead of the group's"
    steps = smoke_group.doc["spec"]["algorithm"]["total_steps"]
    return SimpleNamespace(**vars(smoke_group), client=MlflowClient(smoke_group.store), steps=steps)


def _all_artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for a in client.list_artifacts(run_id, path):
        out |= _all_artifacts(client, run_id, a.path) if a.is_dir else {a.path}
    return out


def _train_run(ns, r):
    """The training run of seed run `r` in the group's store."""
    experiment = ns.client.get_experiment_by_name(experiment_family(r))
    assert experiment is not None
    (run,) = ns.client.search_runs([experiment.experiment_id], f"attributes.run_name = '{run_name(r)}'")
    return experiment, run


def test_training_run_metrics_tags_and_artifacts(ns) -> None:
    steps = list(range(1, ns.steps + 1))
    for r in ns.runs:
        _experiment, run = _train_run(ns, r)
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags[T.SPEC_HASH] == spec_hash(r) and tags[T.KIND] == T.KIND_TRAIN
        assert len(tags[T.DATASET_SHA256]) == 64
        # veRL's metrics (its MLflow logger attached to the launcher's run) and longhaul's sampler accounting.
        for key in (
            "critic/score/mean",
            "response_length/mean",
            "actor/pg_loss",
            "actor/grad_norm",
            "rollout/dropped_groups",
        ):
            assert sorted(m.step for m in ns.client.get_metric_history(run.info.run_id, key)) == steps, key
        assert tags[T.LAST_CHECKPOINT_STEP] == str(steps[-1])
        spec_files = {a.path for a in ns.client.list_artifacts(run.info.run_id, "spec")}
        assert "spec/experiment.yaml" in spec_files
        logged = yaml.safe_load(open(ns.client.download_artifacts(run.info.run_id, "spec/experiment.yaml")))
        assert logged["metadata"]["name"] == r.metadata.name
        assert logged["spec"]["algorithm"]["seed"] == r.spec.algorithm.seed
        # Each seed's trainer got its own seed.
        run_dir = ns.run_dirs[ns.runs.index(r)]
        overrides = (run_dir / "logs" / "hydra" / ".hydra" / "overrides.yaml").read_text()
        assert f"data.seed={r.spec.algorithm.seed}" in overrides


def test_seed_runs_are_children_of_one_group_run(ns) -> None:
    for i, r in enumerate(ns.runs):
        assert f"== seed {r.spec.algorithm.seed}: run {run_name(r)} ({i + 1}/{len(SEEDS)})" in ns.out
    experiment, _run = _train_run(ns, ns.runs[0])
    (parent,) = ns.client.search_runs([experiment.experiment_id], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")
    trains = ns.client.search_runs([experiment.experiment_id], f"tags.`{T.KIND}` = '{T.KIND_TRAIN}'")
    assert sorted(t.info.run_name for t in trains) == sorted(f"{run_name(ns.group)}-s{s}" for s in SEEDS)
    assert {t.data.tags[T.PARENT_RUN_ID] for t in trains} == {parent.info.run_id}


def test_the_evaluated_checkpoint_is_an_eval_child_run(ns) -> None:
    for r in ns.runs:
        _experiment, run = _train_run(ns, r)
        children = fetch_eval_runs(ns.client, run.info.run_id)
        assert sorted(children) == list(range(ns.steps + 1))  # `checkpoints: all`, 0 = the initial policy
        for child_id in children.values():
            child = ns.client.get_run(child_id)
            assert child.data.tags[T.PARENT_RUN_ID] == run.info.run_id
            for k in r.spec.evaluation.k:
                assert f"eval/pass_hat_k/{k}" in child.data.metrics and f"eval/pass_at_k/{k}" in child.data.metrics
            names = _all_artifacts(ns.client, child_id)
            assert any(n.endswith(".jsonl") for n in names), names


def test_compare_reports_statistics_over_the_seeds(ns, tmp_path) -> None:
    """`longhaul compare` on the group's store: one arm of two seeds, each contributing the checkpoint its run
    selected on the training tasks, its rate and between-seed flip rate recomputed from those results files."""
    out = tmp_path / "cmp"
    cmp = subprocess.run(
        [ns.longhaul, "compare", experiment_family(ns.group), "--tracking-uri", ns.store, "--out", str(out)]
        + ["--no-log"],
        cwd=ROOT,
        env=ns.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cmp.returncode == 0, cmp.stderr
    assert "## Statistics over seeds × tasks × samples" in cmp.stdout
    st = json.loads((out / "statistics.json").read_text())
    (arm,) = st["arms"]
    selected = [int(_train_run(ns, r)[1].data.tags[T.SELECTED_STEP]) for r in ns.runs]
    assert [(s["seed"], s["step"]) for s in arm["seeds"]] == list(zip(SEEDS, selected, strict=True)), arm["seeds"]
    records = []
    for r, run_dir, step in zip(ns.runs, ns.run_dirs, selected, strict=True):
        path = run_dir / "eval" / f"step_{step}" / "results.jsonl"
        records += [
            (r.spec.algorithm.seed, d["task_id"], d["trial"], d["success"])
            for d in map(json.loads, path.read_text().splitlines())
        ]
    o = stats.Outcomes.from_records(records)
    (row,) = [r for r in st["rates"] if r["subset"] == "overall"]
    assert (row["seeds"], row["tasks"], row["samples"]) == (2, 6, 2)
    assert row["pass_hat_k"]["1"]["value"] == pytest.approx(stats.rate(o, 1))
    assert row["flip_rate"] == pytest.approx(stats.flip_rate(o))
    assert row["null_agent_floor"] is not None


def test_lora_adapters_are_synced_after_every_update(ns) -> None:
    """vLLM loads the base weights from the model path (`load_format: auto` with LoRA) and never receives them
    again; every sync sends only the adapter, which vLLM receives exactly (`add_lora`) and which changes after
    each update. The seeds train one after another, so the log holds each seed's syncs in a block."""
    sent, served = read_sync_log(ns.sync_log)
    per_run = ns.steps + 1  # the adapter before every rollout, and after the last update
    assert len(sent) == len(served) == per_run * len(SEEDS), (len(sent), len(served))
    base = weights_sum(ROOT / ns.runs[0].spec.policy.model.path)
    assert all(r.weights == pytest.approx(base, rel=1e-9) for r in served)  # the base, as loaded, unchanged
    assert all(n.endswith(("lora_A.weight", "lora_B.weight")) for a in sent for n in a.names)
    assert [r.adapter for r in served] == pytest.approx([a.weights for a in sent], rel=1e-9)
    for i in range(len(SEEDS)):
        adapters = [a.weights for a in sent[i * per_run : (i + 1) * per_run]]
        assert all(a != b for a, b in zip(adapters, adapters[1:], strict=False)), adapters  # each update moved it


def test_lora_checkpoints_are_merged_before_evaluation(ns) -> None:
    """The evaluated checkpoints were merged with their adapter (veRL's merger, then PEFT's merge): each merged
    model is a plain model."""
    from longhaul.checkpoints import MERGE_RECORD, merged_model_dir

    for run_dir in ns.run_dirs:
        for step in range(1, ns.steps + 1):
            merged = merged_model_dir(run_dir, step)
            assert json.loads((merged / MERGE_RECORD).read_text())["lora_merged"] is True
            assert not (merged / "lora_adapter").exists() and list(merged.glob("*.safetensors"))
