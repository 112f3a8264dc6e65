"""Evaluated episodes as MLflow traces (issue 19, item 2): the pure span tree, and the bounded background writer
against a real MLflow sqlite store (read back through MLflow's own trace search)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from longhaul.tracking.traces import (
    SESSION,
    SOURCE_RUN,
    TAG_STEP,
    TAG_TASK,
    TraceLogger,
    build_episode_trace,
    prm_rule_hits,
)
from support.episodes import gold_episode


def test_the_span_tree_follows_the_transcript():
    traj = gold_episode(0, bad_call=True)
    hits, process = prm_rule_hits(traj)
    t = build_episode_trace(traj, run_name="r-1", step=2, run_id="abc", subset="train", rule_hits=hits, process=process)
    root = t.root
    assert root.span_type == "AGENT" and root.attributes["task_id"] == "5" and root.attributes["outcome"] == 1.0
    assert root.attributes["termination"] == "user_stop" and root.attributes["process_score"] == process
    assert root.inputs["first_user_message"] == "Hi, I need help with my booking."
    kinds = [c.span_type for c in root.children]
    assert kinds == ["LLM"] * (len(traj["turns"]) - 1) + ["LLM", "CHAIN"]  # the calls, the goodbye, the user's reply
    first = root.children[0]
    (bad,) = first.children
    assert bad.span_type == "TOOL" and bad.attributes["is_error"] and bad.attributes["parse_error"] == "not JSON"
    assert bad.inputs == '{"user_id": '  # the raw text when the arguments were not a JSON object
    ok = root.children[1].children[0]
    assert not ok.attributes["is_error"] and ok.inputs == traj["turns"][1]["tool_calls"][0]["arguments"]
    assert sum(len(c.attributes.get("prm_lite_rules", [])) for c in root.children) == sum(len(v) for v in hits.values())
    assert t.tags == {TAG_TASK: "5", TAG_STEP: "2", "longhaul.outcome": "1", "longhaul.trace_kind": "eval"}
    assert t.metadata == {SESSION: "r-1/eval_step_2/task_5", SOURCE_RUN: "abc"}
    assert root.count() == 1 + len(root.children) + sum(len(c.children) for c in root.children)


def test_traces_land_in_the_store_linked_to_the_run_with_a_session_per_task(tmp_path: Path):
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    eid = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(eid).info.run_id
    logger = TraceLogger(uri, eid, run_id)
    trajs = [gold_episode(0), gold_episode(1, bad_call=True)]
    for traj in trajs:
        assert logger.submit(build_episode_trace(traj, run_name="r-1", step=2, run_id=run_id))
    counts = logger.close(timeout_s=120)
    assert (counts.logged, counts.dropped) == (2, 0), counts.errors
    found = mlflow.search_traces(locations=[eid], run_id=run_id, return_type="list")
    assert len(found) == 2
    assert {t.info.trace_metadata[SESSION] for t in found} == {"r-1/eval_step_2/task_5"}
    spans = {t.info.tags[TAG_TASK]: t for t in found}
    assert set(spans) == {"5"}
    tools = [s for t in found for s in t.data.spans if s.span_type == "TOOL"]
    assert len(tools) == sum(len(turn["tool_calls"]) for traj in trajs for turn in traj["turns"])
    assert any(s.attributes.get("is_error") for s in tools)


def test_a_full_queue_or_a_dead_store_drops_and_counts_never_blocks(tmp_path: Path):
    traj = gold_episode(0)
    gate = threading.Event()

    class Stuck(TraceLogger):
        def _write(self, mlflow, trace):  # a tracking server that hangs
            gate.wait(30)
            raise ConnectionError("server unreachable")

    logger = Stuck(f"sqlite:///{tmp_path / 'm.db'}", "0", "r", capacity=2)
    trace = build_episode_trace(traj, run_name="r", step=0, run_id="r")
    accepted = [logger.submit(trace) for _ in range(6)]  # one in the writer, two queued, the rest refused at once
    assert accepted.count(False) >= 3
    gate.set()
    counts = logger.close(timeout_s=30)
    assert counts.logged == 0 and counts.dropped == 6 and "server unreachable" in counts.errors[0]


@pytest.mark.parametrize("termination", ["endpoint_error"])
def test_an_unscored_episode_says_so(termination: str):
    traj = {
        **gold_episode(0),
        "termination": termination,
        "grade": None,
        "metadata": {"endpoint_error": "policy endpoint http://x/v1 failed after 3 attempts"},
    }
    t = build_episode_trace(traj, run_name="r", step=0, run_id="r")
    assert t.root.attributes["scored"] is False and t.root.attributes["outcome"] is None
    assert "failed after 3 attempts" in t.root.attributes["endpoint_error"] and t.tags["longhaul.outcome"] == "unscored"


def test_the_eval_stage_logs_and_counts_the_traces_of_a_step(tmp_path: Path):
    """`log_episode_traces` (the eval stage's call): traces linked to the eval run, counts as its metrics."""
    from types import SimpleNamespace

    import mlflow
    from mlflow import MlflowClient

    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.trajectory import Trajectory
    from longhaul.launcher.traces import log_episode_traces
    from longhaul.spec import load_spec
    from support.specs import SPECS_DIR

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    eid = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    train, child = client.create_run(eid).info.run_id, client.create_run(eid).info.run_id
    exp = load_spec(SPECS_DIR / "smoke.yaml")
    ctx = SimpleNamespace(tracking_uri=uri, experiment_id=eid, run_id=train, exp=exp)
    episodes = [Trajectory.from_dict(gold_episode(j)) for j in range(3)]
    said: list[str] = []
    counts = log_episode_traces(ctx, 4, episodes, build_split(exp.spec.environment.split), child, said.append)
    assert counts == {"logged": 3, "dropped": 0} and "3 episode trace(s) in MLflow, 0 dropped" in said[0]
    traces = mlflow.search_traces(locations=[eid], run_id=child, return_type="list")
    assert len(traces) == 3 and {t.info.tags["longhaul.checkpoint_step"] for t in traces} == {"4"}
    assert "process_score" in traces[0].data.spans[0].attributes
    metrics = client.get_run(child).data.metrics
    assert metrics["eval/traces_logged"] == 3 and metrics["eval/traces_dropped"] == 0
    assert not mlflow.search_traces(locations=[eid], run_id=train, return_type="list")


def test_a_sample_of_training_episodes_is_traced_on_the_training_run(tmp_path: Path):
    """`log_training_episodes` (the end of the grpo stage): `training_traces_per_step` episodes of every step, read
    from the rollout traces in (group, sample) order (validation and failures skipped), with their reward; and
    every step's learning-curve metrics (mean reward and outcome, terminations) on the training run."""
    from types import SimpleNamespace

    import mlflow
    from mlflow import MlflowClient

    from longhaul.launcher.traces import log_training_episodes
    from longhaul.spec import load_spec
    from longhaul.tracking.traces import read_training_steps
    from support.specs import SPECS_DIR

    rollouts = tmp_path / "rollouts"
    for step in (1, 2):
        for pid, uids in ((11, ["b", "a"]), (12, ["c"])):
            f = rollouts / f"step_{step}" / f"{pid}.jsonl"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(
                "".join(
                    json.dumps(
                        {
                            "step": step,
                            "uid": u,
                            "session": s,
                            "trajectory": gold_episode(s),
                            "reward": {"score": 1.25 if s else 0.25, "process": 0.8, "outcome": float(s)},
                            "termination": "user_stop" if s else "max_turns",
                        }
                    )
                    + "\n"
                    for u in uids
                    for s in (1, 0)
                )
            )
        (rollouts / f"val_step_{step}").mkdir()
        (rollouts / f"val_step_{step}" / "1.jsonl").write_text(json.dumps({"trajectory": gold_episode(9)}) + "\n")
        (rollouts / f"step_{step}" / "failures").mkdir()
    # The sample is the first episodes of each step in (group uid, sample) order.
    picked = [(s, r["uid"], r["session"]) for s, lines in read_training_steps(rollouts) for r in lines[:3]]
    assert picked == [
        (1, "a", 0),
        (1, "a", 1),
        (1, "b", 0),
        (2, "a", 0),
        (2, "a", 1),
        (2, "b", 0),
    ]

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    eid = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    train = client.create_run(eid).info.run_id
    exp = load_spec(SPECS_DIR / "smoke.yaml")
    assert exp.spec.tracking.training_traces_per_step == 2
    said: list[str] = []
    counts = log_training_episodes(
        SimpleNamespace(tracking_uri=uri, experiment_id=eid, run_id=train, exp=exp), str(rollouts), said.append
    )
    assert counts == {"logged": 4, "dropped": 0}, said
    traces = mlflow.search_traces(locations=[eid], run_id=train, return_type="list")
    assert sorted(t.info.tags["longhaul.checkpoint_step"] for t in traces) == ["1", "1", "2", "2"]
    assert {t.info.tags["longhaul.trace_kind"] for t in traces} == {"train"}
    root = next(t for t in traces if t.data.spans[0].attributes["trial"] == 1).data.spans[0]
    assert root.attributes["reward"] == 1.25 and root.attributes["process_score"] == 0.8
    metrics = client.get_run(train).data.metrics
    assert metrics["train/traces_logged"] == 4 and metrics["train/traces_dropped"] == 0
    # The learning curve's training side, at every step: 3 groups of 2 samples, sample 1 succeeded in each.
    for key, value in (
        ("train/episodes", 6),
        ("train/outcome_mean", 0.5),
        ("train/reward_mean", 0.75),
        ("train/terminations/user_stop", 3),
        ("train/terminations/max_turns", 3),
    ):
        assert [(m.step, m.value) for m in client.get_metric_history(train, key)] == [(1, value), (2, value)], key


def test_a_tracking_server_that_fails_never_fails_the_finished_training_stage(tmp_path: Path, monkeypatch):
    """`log_training_episodes` after training: the step metrics failing to log is said once, not raised."""
    from types import SimpleNamespace

    import yaml

    from longhaul.launcher.traces import log_training_episodes
    from longhaul.spec import load_spec
    from longhaul.tracking import runs
    from support.specs import SPECS_DIR

    for step in (1, 2):
        f = tmp_path / "rollouts" / f"step_{step}" / "1.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"uid": "a", "trajectory": gold_episode(0), "reward": {"outcome": 1.0}}) + "\n")

    def refuse(*_a, **_k):
        raise RuntimeError("tracking server down")  # what MLflow raises past its retries is not an OSError

    monkeypatch.setattr(runs, "log_metrics", refuse)
    doc = yaml.safe_load((SPECS_DIR / "smoke.yaml").read_text())
    doc["spec"].setdefault("tracking", {})["training_traces_per_step"] = 0  # no traces: only the step metrics
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    exp = load_spec(tmp_path / "spec.yaml")
    said: list[str] = []
    ctx = SimpleNamespace(tracking_uri="http://127.0.0.1:9", experiment_id="1", run_id="r", exp=exp)
    assert log_training_episodes(ctx, str(tmp_path / "rollouts"), said.append) == {"logged": 0, "dropped": 0}
    assert said == ["training episodes: step metrics not logged (RuntimeError: tracking server down)"]
