"""The single-process GRPO loop against scripted OpenAI-compatible servers (no vLLM): real episodes through the
shared runner, real grading, PRM-Lite, the spec's estimator, veRL's losses on a tiny random Qwen2, veRL-layout
checkpoints, MLflow metrics, served-weights hand-over, resume and the SIGUSR1 checkpoint."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from longhaul.launcher.control import RequeueRequested, StopControl
from longhaul.launcher.supervisor import StageContext
from longhaul.render.plan import render_plan
from longhaul.spec import parse_spec_text
from longhaul.trainer.checkpoint import latest_step, saved_steps
from longhaul.trainer.loop import run_training_stage, step_tasks
from support.airline_scripts import airline_scripts
from support.openai_stub import StubServer

pytestmark = [pytest.mark.verl, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def base_policy(tmp_path_factory):
    """A tiny random Qwen2 with a tokenizer trained on the airline policy text and tool schemas."""
    from longhaul.envs.airline.tasks import policy_text
    from longhaul.envs.runner import tool_schemas
    from longhaul.tiny.models import TinyArch, build_model
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    corpus = [policy_text(), *(json.dumps(t) for t in tool_schemas())] * 2
    tok = build_hf_tokenizer(corpus, vocab_size=2048)
    arch = TinyArch(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=16384)
    model = build_model(arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, seed=0)
    out = tmp_path_factory.mktemp("policy")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


class FakePolicyServer:
    """Stands in for the launcher's PolicyServer: records which weights it was told to serve."""

    def __init__(self, base_url: str, name: str) -> None:
        self.base_url, self.served_model_name, self.serving = base_url, name, "base"
        self.served: list[str] = []

    def serve_weights(self, src, label, abort=None) -> float:
        assert (Path(src) / "model.safetensors").is_file()
        self.served.append(str(src))
        self.serving = label
        return 0.0


def _ctx(tmp_path, base_policy, stub, run="run", **alg):
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["policy"]["model"] = {"name": "policy", "path": str(base_policy)}
    doc["spec"]["user_simulator"]["model"] = {"name": "user"}
    doc["spec"]["algorithm"].update({"group_size": 2, "train_batch_size": 2, "ppo_mini_batch_size": 2,
                                     "ppo_micro_batch_size_per_gpu": 2, "learning_rate": 1e-2, **alg})
    exp = parse_spec_text(yaml.safe_dump(doc))
    from longhaul.tracking.runs import start_or_resume_run

    run_dir = tmp_path / run
    uri = f"sqlite:///{tmp_path / run}.db"
    tracked = start_or_resume_run(exp, uri, run_dir, "local", environ={})
    plan = render_plan(exp, "local", str(run_dir))
    policy = FakePolicyServer(stub.base_url, "policy")
    ctx = StageContext(exp, plan, run_dir, uri, tracked.run_id, {}, StopControl(), stub.base_url, "user", io.StringIO(),
                       _policy=policy)
    return ctx, policy


@pytest.fixture()
def stub():
    with StubServer(airline_scripts("airline-flaky")) as srv:
        yield srv


def test_two_steps_update_checkpoint_serve_log_then_resume(tmp_path, base_policy, stub):
    from mlflow.tracking import MlflowClient

    ctx, policy = _ctx(tmp_path, base_policy, stub, total_steps=2)
    run_training_stage(ctx)
    assert saved_steps(ctx.checkpoint_dir) == [1, 2] and latest_step(ctx.checkpoint_dir) == 2
    # After step 1 the server was told to serve step 1's weights (not after the last step).
    assert policy.served == [str(ctx.checkpoint_dir / "global_step_1" / "huggingface")]
    client = MlflowClient(ctx.tracking_uri)
    m = {k: {x.step: x.value for x in client.get_metric_history(ctx.run_id, k)}
         for k in ("reward/mean", "actor/loss", "policy/logprob_before", "policy/logprob_after",
                   "saturation/frac_all_fail", "response_length/mean", "reward/process/mean")}
    assert all(sorted(v) == [1, 2] for v in m.values()), m
    assert all(m["policy/logprob_after"][s] != m["policy/logprob_before"][s] for s in (1, 2))
    # Step 2's "before" is the model after step 1 (the same weights the server was given).
    assert m["policy/logprob_before"][2] != m["policy/logprob_before"][1]
    tags = client.get_run(ctx.run_id).data.tags
    assert tags["longhaul.checkpoint_uri.2"].startswith("file://")
    rows = ctx.results["train_rows"]
    assert [r["step"] for r in rows] == [1, 2]

    # A run directory holding global_step_2 (here: a copy, for a longer spec) resumes from it: the server gets
    # step 2's weights first and only step 3 is trained.
    ctx3, policy3 = _ctx(tmp_path, base_policy, stub, run="run3", total_steps=3)
    shutil.copytree(ctx.checkpoint_dir, ctx3.checkpoint_dir)
    run_training_stage(ctx3)
    assert policy3.served[0] == str(ctx3.checkpoint_dir / "global_step_2" / "huggingface")
    assert saved_steps(ctx3.checkpoint_dir) == [1, 2, 3]
    assert [r["step"] for r in ctx3.results["train_rows"]] == [3]


def test_checkpoint_request_saves_and_requeues(tmp_path, base_policy, stub):
    ctx, policy = _ctx(tmp_path, base_policy, stub, total_steps=3, save_freq=2)
    # The request arrives during step 1: step 1 completes, is saved although save_freq is 2, then requeue.
    orig = policy.serve_weights

    def serve_and_signal(src, label, abort=None):
        ctx.control.request_checkpoint()
        return orig(src, label, abort)

    policy.serve_weights = serve_and_signal
    with pytest.raises(RequeueRequested):
        run_training_stage(ctx)
    assert saved_steps(ctx.checkpoint_dir) == [1]


def test_step_tasks_cycle_through_a_seeded_shuffle():
    ids = ["0", "1", "2", "4"]
    first_epoch = step_tasks(ids, 1, 2, 7) + step_tasks(ids, 2, 2, 7)
    assert sorted(first_epoch) == sorted(ids)
    assert step_tasks(ids, 1, 2, 7) == step_tasks(ids, 1, 2, 7)
    assert sorted(step_tasks(ids, 3, 2, 7) + step_tasks(ids, 4, 2, 7)) == sorted(ids)
