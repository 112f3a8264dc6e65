"""The MLflow relay (`longhaul.tracking.relay`) without a server: a second sqlite store stands in for it
(`force=True`), or an address where nothing listens. The real server, stopped and slowed, is in
tests/reliability/test_tracking_faults.py."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from longhaul import layout
from longhaul.analysis import tags as T
from longhaul.analysis.selection import Selection
from longhaul.spec import load_spec
from longhaul.tracking import relay as R
from longhaul.tracking import relayed, runs
from longhaul.tracking.client import TrackingError
from longhaul.tracking.config import local_store_uri

ROOT = Path(__file__).resolve().parents[3]


def _dead_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An empty, migrated MLflow sqlite store, copied wherever a test needs a new one (creating one runs MLflow's
    migrations: seconds)."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(local_store_uri(path)).search_experiments()
    return path


def _new_store(template: Path, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, path)
    return path


@pytest.fixture
def run_dir(tmp_path, empty_store) -> Path:
    """A run directory whose relay buffer store already exists (empty)."""
    _new_store(empty_store, tmp_path / "run" / layout.RELAY_DIR / layout.RELAY_BUFFER_DB)
    return tmp_path / "run"


@pytest.fixture
def remote(tmp_path, empty_store):
    """A "server": its own sqlite store, with one training run."""
    uri = local_store_uri(_new_store(empty_store, tmp_path / "server" / "mlflow.db"))
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("fam")).info.run_id
    return uri, client, run_id


def _trainer_log(relay: R.MetricsRelay, steps: range, keys=("a", "b"), per_call: int = 100) -> list[Metric]:
    """Log as the trainer does: to the buffer store's mirror run (veRL's logger uses the same store API;
    `per_call` steps per request keep the test short)."""
    env = relay.trainer_env
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    logged = [Metric(k, float(step) + i / 10, 1_000 + step, step) for step in steps for i, k in enumerate(keys)]
    n = per_call * len(keys)
    for i in range(0, len(logged), n):
        client.log_batch(env["MLFLOW_RUN_ID"], metrics=logged[i : i + n])
    return logged


def _trainer_params(relay: R.MetricsRelay, params: dict[str, str]) -> None:
    MlflowClient(relay.local_uri).log_batch(relay.local_run_id, params=[Param(k, v) for k, v in params.items()])


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float, int]]:
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))


def test_local_stores_need_no_relay(tmp_path):
    relay = R.start_relay(local_store_uri(tmp_path), "r1", tmp_path)
    assert not relay.active and relay.trainer_env == {} and relay.close() == R.RelayCounts()
    assert not (tmp_path / layout.RELAY_DIR).exists()
    assert relayed.needs_relay("http://mlflow:5000") and relayed.needs_relay("databricks://x")
    assert not relayed.needs_relay("sqlite:////x/mlflow.db") and not relayed.needs_relay("file:///x/mlruns")


def test_metrics_and_params_arrive_exactly_once_even_when_resent(run_dir, remote):
    uri, client, run_id = remote
    said: list[str] = []
    relay = R.start_relay(uri, run_id, run_dir, force=True, poll_s=0.05, say=said.append)
    MlflowClient(relay.local_uri).log_param(relay.local_run_id, "trainer.lr", "1e-6")
    logged = _trainer_log(relay, range(1, 1201))  # 2,400 rows: three log_batch chunks
    counts = relay.close(flush_s=30)
    assert counts.produced == counts.flushed == len(logged) and counts.pending == counts.dropped == 0
    assert _history(client, run_id, "a") == [(m.step, m.value, m.timestamp) for m in logged if m.key == "a"]
    assert client.get_run(run_id).data.params == {"trainer.lr": "1e-6"}
    assert "2400 trainer metrics (2400 sent, 0 buffered, 0 dropped)" in said[-1]

    # A launcher killed after the server acknowledged but before the state was saved sends again: no duplicate.
    state_file = run_dir / layout.RELAY_DIR / layout.RELAY_STATE_FILE
    state = json.loads(state_file.read_text())
    state.update(metrics_rowid=0, params_sent={})
    state_file.write_text(json.dumps(state))
    again = R.start_relay(uri, run_id, run_dir, force=True, poll_s=0.05, say=said.append)
    assert again.mirror_run_ids == [relay.local_run_id, again.local_run_id]  # the next launch's mirror run
    assert again.close(flush_s=30).flushed == len(logged)
    assert len(client.get_metric_history(run_id, "a")) == len(logged) // 2


def test_longhaul_records_are_queued_in_order_and_applied_idempotently(run_dir, remote):
    uri, client, run_id = remote
    client.set_tag(run_id, T.RUN_NAME, "smoke-0123")
    relay = R.MetricsRelay(uri, run_id, run_dir, force=True, poll_s=0.05, say=lambda m: None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(relayed, "_ACTIVE", {})
        relayed._ACTIVE[run_id] = relay  # registered, not started: everything stays queued
        runs.log_checkpoint(uri, run_id, 5, "file:///ckpt/global_step_5")
        assert runs.log_evaluation(run_id, 5, {"tasks": 1, "pass_hat_k": {"1": 0.5}}, None, tracking_uri=uri) is None
        runs.log_selection(uri, run_id, "train", Selection("train", 5, 0.5, 1))
        runs.finish_run(uri, run_id, "FINISHED")
        ops = [p.name.split("-", 1)[1] for _, p in relay.outbox.pending()]
        assert ops == ["log_checkpoint.json", "log_evaluation.json", "log_selection.json", "finish_run.json"]
        assert client.get_run(run_id).data.tags.get(T.LAST_CHECKPOINT_STEP) is None  # nothing sent yet
        relay.flush_once()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[T.LAST_CHECKPOINT_STEP] == "5"
    assert run.data.tags[T.SELECTED_STEP] == "5" and run.data.metrics["eval/pass_hat_k/1"] == 0.5
    assert relay.counts().ops_done == 4 and relay.counts().ops_pending == 0
    children = runs.fetch_eval_runs(uri, run_id)
    assert list(children) == [5]
    # a re-applied evaluation reuses its child and adds no metric value twice
    args = {"checkpoint_step": 5, "summary": {"tasks": 1, "pass_hat_k": {"1": 0.5}}, "jsonl_path": None, "time_ms": 7}
    runs.apply_operation(client, run_id, "log_evaluation", args)
    runs.apply_operation(client, run_id, "log_evaluation", args)
    assert runs.fetch_eval_runs(uri, run_id) == children
    assert len(client.get_metric_history(run_id, "eval/pass_hat_k/1")) == 2  # the queued one and this one
    with pytest.raises(TrackingError, match="unknown queued MLflow operation 'nope'; valid: log_checkpoint"):
        runs.apply_operation(client, run_id, "nope", {})


def test_server_down_buffers_on_disk_and_a_new_launch_continues(run_dir):
    uri, said = _dead_uri(), []
    relay = R.start_relay(uri, "remote-run", run_dir, poll_s=0.05, probe_timeout_s=0.5, say=said.append)
    t0 = time.monotonic()
    logged = _trainer_log(relay, range(1, 51))
    took = time.monotonic() - t0
    runs.finish_run(uri, "remote-run", "FINISHED")
    counts = relay.close(flush_s=0.3)
    assert took < 10  # the trainer never waits for the server
    assert (counts.produced, counts.flushed, counts.pending, counts.dropped) == (len(logged), 0, len(logged), 0)
    assert (counts.ops_queued, counts.ops_pending) == (1, 1)
    assert any("unavailable (ConnectionRefusedError" in m for m in said), said
    assert "sent by the next launch of this run or by `python -m longhaul.tracking.relay flush" in said[-1]
    assert relayed.mirror_of("remote-run") == (relay.local_uri, [relay.local_run_id])  # the summary reads the buffer
    assert runs.fetch_step_metrics(uri, "remote-run", ["a"])[50] == {"a": 50.0}
    # the next launch: a mirror run of its own (veRL's params may differ), the earlier one still pending
    nxt = R.MetricsRelay(uri, "remote-run", run_dir, say=said.append)
    assert nxt.mirror_run_ids == [relay.local_run_id, nxt.local_run_id]
    _trainer_log(nxt, range(51, 61))
    assert nxt.counts().pending == len(logged) + 20


def test_params_that_changed_between_launches_are_counted_not_blocking(run_dir, remote):
    uri, client, run_id = remote
    first = R.start_relay(uri, run_id, run_dir, force=True, poll_s=0.05, say=lambda m: None)
    _trainer_params(first, {"lr": "1e-6", "steps": "30"})
    first.close(flush_s=30)
    said: list[str] = []
    second = R.start_relay(uri, run_id, run_dir, force=True, poll_s=0.05, say=said.append)
    _trainer_params(second, {"lr": "1e-6", "steps": "60", "new": "x"})
    _trainer_log(second, range(1, 4))
    counts = second.close(flush_s=30)
    assert client.get_run(run_id).data.params == {"lr": "1e-6", "steps": "30", "new": "x"}
    assert (counts.params_flushed, counts.params_rejected, counts.pending) == (3, 1, 0)
    assert any("kept its earlier values of 1 params" in m and "steps" in m for m in said)


def test_resume_while_the_server_is_down_uses_the_run_directory_record(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "PROBE_TIMEOUT_S", 0.5)
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    uri = _dead_uri()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = runs.TrackedRun("abc123", "7", "longhaul/smoke", "smoke-x", runs.spec_hash(exp), False, 1)
    runs._write_run_info(run_dir, first)
    tracked = runs.start_or_resume_run(exp, uri, run_dir, "local", environ={"LONGHAUL_JOB_ID": "job-2"})
    assert (tracked.run_id, tracked.resumed, tracked.attempts) == ("abc123", True, 2)
    queued = sorted((run_dir / layout.RELAY_DIR / layout.RELAY_OUTBOX_SUBDIR).glob("*-resume_run.json"))
    op = json.loads(queued[0].read_text())
    assert op["args"]["provenance"][T.JOB_ID] == "job-2" and op["args"]["token"].startswith("job-2:")


def test_a_replaced_mlflow_run_gets_a_fresh_relay_and_the_old_buffer_is_kept(run_dir):
    said: list[str] = []
    old = R.MetricsRelay(_dead_uri(), "old-run", run_dir, say=said.append)
    _trainer_log(old, range(1, 3))
    old.enqueue("finish_run", status="FINISHED")
    new = R.MetricsRelay(_dead_uri(), "new-run", run_dir, say=said.append)
    assert new.mirror_run_ids == [new.local_run_id] and new.counts() == R.RelayCounts()
    kept = run_dir / layout.RELAY_DIR
    assert len(list((kept / f"{layout.RELAY_OUTBOX_SUBDIR}.old-run").glob("*.json"))) == 1
    assert json.loads((kept / f"{layout.RELAY_STATE_FILE}.old-run").read_text())["mirror_run_ids"] == [old.local_run_id]
    assert "relayed MLflow run old-run, not new-run" in said[-1]
