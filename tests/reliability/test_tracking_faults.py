"""The MLflow server down or slow during training: training goes on, metrics are buffered and flushed when it
answers again, nothing is lost (`longhaul.tracking.relay`).

Metrics go through the path the trainer uses — veRL's `Tracking` logger in a subprocess
(`support/verl_metrics_trainer.py`), attached with the relay's MLFLOW_TRACKING_URI / MLFLOW_RUN_ID — and
longhaul's own records (checkpoint, evaluation, resume, run status) through `longhaul.tracking.runs`, as the
launcher does. The server is a real `mlflow server`: stopped and restarted on the same address (with a launcher
restart during the outage), or put behind a TCP proxy that black-holes it, then slows every chunk.
Every metric must arrive exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.layout import RELAY_DIR, RELAY_STATE_FILE
from longhaul.spec import load_spec, parse_spec_text
from longhaul.tracking.relay import start_relay
from longhaul.tracking.runs import (
    fetch_eval_runs,
    finish_run,
    log_checkpoint,
    log_evaluation,
    start_or_resume_run,
)
from support.mlflow_server import restart_mlflow_server, start_mlflow_server, stop_mlflow_server
from support.tcp_proxy import TcpProxy
from support.verl_metrics_trainer import expected_value

pytestmark = pytest.mark.mlflow

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "tests" / "support" / "verl_metrics_trainer.py"
KEYS = 12
#: The relay's pace in these tests (production: 2 s polls, 5 s health checks, back-off up to 60 s).
RELAY = {"poll_s": 0.2, "probe_timeout_s": 1.0, "backoff_max_s": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real server; a test that restarts it puts the new handle in `server["s"]`."""
    holder = {"s": start_mlflow_server(tmp_path_factory.mktemp("mlflow-faults"))}
    yield holder
    stop_mlflow_server(holder["s"])


@pytest.fixture(autouse=True)
def impatient_mlflow_client(monkeypatch):
    """A request the outage catches in flight fails within seconds instead of after MLflow's ≈ 4 min of
    retries (the relay keeps its data either way; this only keeps the test short)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")


class Trainer:
    """`verl_metrics_trainer.py` in a subprocess; `steps` fills with its per-step lines as they come."""

    def __init__(self, env: dict[str, str], first: int, steps: int, interval: float) -> None:
        self.steps: list[dict] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(TRAINER),
                "--first",
                str(first),
                "--steps",
                str(steps),
                "--keys",
                str(KEYS),
                "--interval",
                str(interval),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip() == "ready":
                self.ready.set()
            elif line.startswith("{"):
                self.steps.append(json.loads(line))

    def wait_step(self, n: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.steps or self.steps[-1]["step"] < n:
            assert self.proc.poll() is None or self.steps, f"trainer exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, f"trainer did not reach step {n}"
            time.sleep(0.05)

    def wait(self, timeout_s: float = 300) -> list[dict]:
        assert self.proc.wait(timeout=timeout_s) == 0
        time.sleep(0.2)  # the reader thread takes the last lines
        return self.steps


def _trainer_env(relay) -> dict[str, str]:
    env = {**os.environ, **relay.trainer_env}
    env.pop("MLFLOW_EXPERIMENT_NAME", None)
    return env


def _arrivals(client: MlflowClient, run_id: str) -> dict[tuple[str, int], list[float]]:
    """(key, step) → values the server holds for the trainer's keys."""
    out: dict[tuple[str, int], list[float]] = {}
    for i in range(KEYS):
        for m in client.get_metric_history(run_id, f"k{i}"):
            out.setdefault((m.key, m.step), []).append(m.value)
    return out


def _tally(arrived: dict, steps: list[int]) -> tuple[int, int, int, int]:
    """(logged, arrived exactly once with the right value, missing, duplicated) over `steps` × KEYS."""
    ok = missing = dup = 0
    for step in steps:
        for i in range(KEYS):
            values = arrived.get((f"k{i}", step), [])
            missing += not values
            dup += len(values) > 1
            ok += values == [expected_value(step, i)]
    return len(steps) * KEYS, ok, missing, dup


def _spec(name: str):
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["metadata"]["name"] = name
    return parse_spec_text(yaml.safe_dump(doc), file=f"{name}.yaml")


def test_server_down_with_a_launcher_restart_loses_nothing(server, tmp_path, reliability):
    srv = server["s"]
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    run_dir = tmp_path / "run"
    said: list[str] = []
    tracked = start_or_resume_run(exp, srv.uri, run_dir, "local", environ={"LONGHAUL_JOB_ID": "job-1"})
    relay = start_relay(srv.uri, tracked.run_id, run_dir, say=said.append, **RELAY)

    # launch 1: the server stops at step 5; the trainer goes on; a checkpoint is recorded meanwhile
    first = Trainer(_trainer_env(relay), 1, 30, 0.3)
    first.wait_step(5)
    stop_mlflow_server(srv)
    t_down = time.time()
    log_checkpoint(srv.uri, tracked.run_id, 10, "file:///ckpt/global_step_10")
    steps1 = first.wait()
    # the launcher dies while the server is down (no flush)
    at_death = relay.close(flush_s=0)

    # launch 2, the server still down: the run resumes from the run directory's record
    again = start_or_resume_run(exp, srv.uri, run_dir, "local", environ={"LONGHAUL_JOB_ID": "job-2"})
    relay2 = start_relay(srv.uri, again.run_id, run_dir, say=said.append, **RELAY)
    second = Trainer(_trainer_env(relay2), 31, 30, 0.1)
    second.wait_step(36)
    jsonl = tmp_path / "results.jsonl"
    jsonl.write_text('{"task_id": "1", "trial": 0, "success": true}\n')
    log_evaluation(tracked.run_id, 10, {"tasks": 1, "pass_hat_k": {"1": 1.0}}, jsonl, tracking_uri=srv.uri)
    srv = server["s"] = restart_mlflow_server(srv)
    t_up = time.time()
    steps2 = second.wait()
    finish_run(srv.uri, tracked.run_id, "FINISHED")
    counts = relay2.close(flush_s=120)

    client = MlflowClient(srv.uri)
    arrived = _arrivals(client, tracked.run_id)
    all_steps = [s["step"] for s in steps1 + steps2]
    during = [s["step"] for s in steps1 + steps2 if t_down <= s["start"] <= t_up]
    took_during = max(s["took"] for s in steps1 + steps2 if t_down <= s["start"] <= t_up)
    logged, ok, missing, dup = _tally(arrived, during)
    reliability(
        "tracking",
        f"MLflow down {t_up - t_down:.0f} s during training (veRL logger, 2 launches)",
        injected=logged,
        survived=ok,
        lost=missing,
        lost_what="metrics",
    )
    _, _, b_missing, b_dup = _tally(arrived, [s["step"] for s in steps1])
    reliability(
        "tracking",
        "launcher restarted while MLflow was down (buffer on disk)",
        injected=at_death.pending,
        survived=at_death.pending - min(at_death.pending, b_missing + b_dup),
        lost=b_missing,
        lost_what="metrics",
    )
    run = client.get_run(tracked.run_id)
    records = {
        "checkpoint": run.data.tags.get(T.LAST_CHECKPOINT_STEP) == "10",
        "evaluation": list(fetch_eval_runs(client, tracked.run_id)) == [10],
        "resume": run.data.tags.get(T.ATTEMPTS) == "2" and run.data.tags.get(T.JOB_IDS) == "job-1,job-2",
        "status": run.info.status == "FINISHED",
    }
    reliability(
        "tracking",
        "MLflow down: longhaul records (checkpoint, evaluation, resume, status)",
        injected=len(records),
        survived=sum(records.values()),
        lost=len(records) - sum(records.values()),
        lost_what="records",
    )

    print(
        f"down {t_up - t_down:.0f} s: {len(during)} steps logged meanwhile, slowest log call {took_during:.3f} s; "
        f"relay: {counts.summary()}"
    )
    assert all_steps == list(range(1, 61)) and len(during) >= 20, (all_steps, during)
    assert (ok, missing, dup) == (logged, 0, 0)
    assert _tally(arrived, all_steps)[1:] == (60 * KEYS, 0, 0)  # every metric of the run exactly once
    assert took_during < 5.0, took_during  # the trainer never waited for the server
    assert tracked.run_id == again.run_id and again.resumed and at_death.pending > 0
    assert all(records.values()), records
    assert counts.pending == counts.ops_pending == counts.dropped == 0 and counts.produced == 60 * KEYS
    # launch 2's veRL config says 60 total steps where launch 1's said 30: the server keeps the first, says so
    assert counts.params_rejected == 1 and run.data.params["trainer/total_training_steps"] == "30"
    assert any("unavailable" in m for m in said) and any("reachable again" in m for m in said)

    # a launcher killed between the server's acknowledgement and saving its progress sends again: no duplicate
    state_file = run_dir / RELAY_DIR / RELAY_STATE_FILE
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "metrics_rowid": 0}))
    resent = start_relay(srv.uri, tracked.run_id, run_dir, say=said.append, **RELAY).close(flush_s=120)
    assert resent.flushed == 60 * KEYS
    assert _tally(_arrivals(client, tracked.run_id), all_steps)[1:] == (60 * KEYS, 0, 0)


def test_server_black_holed_then_slow_loses_nothing(server, tmp_path, reliability):
    srv = server["s"]
    exp = _spec("relay-slow")
    run_dir = tmp_path / "run"
    said: list[str] = []
    with TcpProxy(srv.port) as proxy:
        tracked = start_or_resume_run(exp, proxy.uri, run_dir, "local")
        relay = start_relay(proxy.uri, tracked.run_id, run_dir, say=said.append, **RELAY)
        trainer = Trainer(_trainer_env(relay), 1, 80, 0.2)
        trainer.wait_step(5)
        proxy.set_mode("blackhole")
        t_hole = time.time()
        log_checkpoint(proxy.uri, tracked.run_id, 10, "file:///ckpt/global_step_10")
        time.sleep(8)
        proxy.set_mode("delay", 0.5)
        t_slow = time.time()
        time.sleep(5)
        proxy.set_mode("pass")
        t_pass = time.time()
        steps = trainer.wait()
        counts = relay.close(flush_s=120)
        client = MlflowClient(proxy.uri)
        arrived = _arrivals(client, tracked.run_id)
        checkpoint = client.get_run(tracked.run_id).data.tags.get(T.LAST_CHECKPOINT_STEP) == "10"

    hole = [s["step"] for s in steps if t_hole <= s["start"] < t_slow]
    slow = [s["step"] for s in steps if t_slow <= s["start"] < t_pass]
    took = max(s["took"] for s in steps if t_hole <= s["start"] < t_pass)
    for label, window, seconds in (
        ("black-holed", hole, t_slow - t_hole),
        ("slow (+0.5 s per chunk)", slow, t_pass - t_slow),
    ):
        logged, ok, missing, _ = _tally(arrived, window)
        reliability(
            "tracking",
            f"MLflow {label} {seconds:.0f} s during training (veRL logger)",
            injected=logged,
            survived=ok,
            lost=missing,
            lost_what="metrics",
        )
    print(
        f"black-holed {t_slow - t_hole:.0f} s, slow {t_pass - t_slow:.0f} s: slowest log call {took:.3f} s; "
        f"relay: {counts.summary()}"
    )
    assert [s["step"] for s in steps] == list(range(1, 81)) and hole and slow
    assert _tally(arrived, list(range(1, 81)))[1:] == (80 * KEYS, 0, 0)
    assert took < 5.0, took
    assert checkpoint and counts.pending == counts.ops_pending == 0
