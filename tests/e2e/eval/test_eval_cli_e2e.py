"""`longhaul eval` / `eval summarize` / `env …` end to end through the real CLI, against the scripted
OpenAI-compatible server on loopback (scripted user; a gold policy and a wrong-in-known-ways policy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longhaul.envs.airline.splits import build_split
from support.airline_scripts import airline_scripts, flaky_target
from support.openai_stub import StubServer

SPEC = """\
apiVersion: longhaul.dev/v1alpha1
kind: Experiment
metadata:
  name: stub-eval
spec:
  stages: [eval]
  environment:
    max_turns: 30
    abort_repeated_calls: 3
  evaluation:
    samples_per_task: 4
    k: [1, 2, 4]
    bootstrap_samples: 400
    concurrency: 48
"""


def longhaul(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"longhaul {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    p = tmp_path / "stub-eval.yaml"
    p.write_text(SPEC)
    return p


def run_eval(srv: StubServer, spec: Path, policy: str, out: Path) -> dict:
    proc = longhaul(
        "eval",
        "--spec",
        str(spec),
        "--policy-url",
        srv.base_url,
        "--policy-model",
        policy,
        "--user-url",
        srv.base_url,
        "--user-model",
        "user",
        "-o",
        str(out),
        "--json",
        "--no-progress",
    )
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_gold_policy_scores_1_everywhere(spec_file, tmp_path):
    with StubServer(airline_scripts("airline-gold")) as srv:
        s = run_eval(srv, spec_file, "gold", tmp_path / "gold")
    assert s["c_over_n"] == "200/200" and s["tasks"] == 50
    assert s["pass_hat_k"] == {"1": 1.0, "2": 1.0, "4": 1.0} == s["pass_at_k"]
    assert s["abort_rate"] == 0.0 and s["tool_errors"] == 0
    assert set(s["subsets"]) == {"train", "test", "covered_seen", "uncovered_seen", "unseen"}
    assert all(b["pass_hat_k"]["4"] == 1.0 for b in s["subsets"].values())
    assert s["null_agent_floor"] == pytest.approx(23 / 50)
    lines = (tmp_path / "gold" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 200
    rec = json.loads(lines[0])
    assert {"task_id", "trial", "seed", "success", "subset", "subsets", "termination", "harness", "data"} <= set(rec)
    trajs = (tmp_path / "gold" / "trajectories.jsonl").read_text().splitlines()
    assert len(trajs) == 200 and json.loads(trajs[0])["messages"][0]["role"] == "system"
    seeds = {json.loads(x)["seed"] for x in lines}
    assert len(seeds) == 200  # a distinct sampling seed per trial


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_flaky_policy_gives_the_expected_pass_k_subsets_and_cis(spec_file, tmp_path):
    with StubServer(airline_scripts("airline-flaky")) as srv:
        s = run_eval(srv, spec_file, "flaky", tmp_path / "flaky")
    # c_i = i mod 5 successes of n = 4 for task i: 0..4 ten times each.
    assert s["c_over_n"] == "100/200"
    assert s["pass_hat_k"]["1"] == pytest.approx(0.5)
    assert s["pass_hat_k"]["2"] == pytest.approx(1 / 3)  # (0+0+1+3+6)/6/5
    assert s["pass_hat_k"]["4"] == pytest.approx(0.2)  # only c = 4
    assert s["pass_at_k"]["2"] == pytest.approx(2 / 3)  # 1 − (6+3+1+0+0)/6/5
    assert s["pass_at_k"]["4"] == pytest.approx(0.8)  # c ≥ 1
    per_task = {t["task_id"]: t["c"] for t in s["per_task"]}
    assert per_task == {str(i): flaky_target(str(i)) for i in range(50)}
    split = build_split("seed_40_10")
    for name, ids in split.subsets.items():
        assert s["subsets"][name]["pass_hat_k"]["1"] == pytest.approx(_mean(flaky_target(t) / 4 for t in ids)), name
        assert s["subsets"][name]["c_over_n"] == f"{sum(flaky_target(t) for t in ids)}/{4 * len(ids)}"
    unc, uns = s["subsets"]["uncovered_seen"]["pass_hat_k"]["1"], s["subsets"]["unseen"]["pass_hat_k"]["1"]
    assert s["generalisation_pass_hat_1"] == pytest.approx((unc * 24 + uns * 10) / 34)
    for kind in ("pass_hat_k", "pass_at_k"):
        for k, (lo, hi) in s["ci"][kind].items():
            assert lo <= s[kind][k] <= hi
    assert s["ci"]["pass_hat_k"]["1"][0] < s["ci"]["pass_hat_k"]["1"][1]
    # Every failing trial of this policy is an abort (loop or format error); tool errors are counted apart.
    bad = [(i, a) for i in range(50) for a in range(flaky_target(str(i)), 4)]
    assert s["aborted_trials"] == len(bad) == 100 and s["abort_rate"] == 0.5
    assert s["terminations"]["loop"] == sum(1 for _, a in bad if a % 2 == 0)
    assert s["terminations"]["policy_format_error"] == sum(1 for _, a in bad if a % 2 == 1)
    assert s["unknown_tool_calls"] == sum(flaky_target(str(i)) for i in range(0, 50, 2))
    assert 0 < s["tool_error_rate"] < 1 and s["tool_errors"] == s["unknown_tool_calls"] + 3 * s["terminations"]["loop"]

    # Re-scoring the per-trial file gives the same numbers (and the same seeded CIs).
    results = tmp_path / "flaky" / "results.jsonl"
    again = json.loads(
        longhaul("eval", "summarize", str(results), "--k", "1,2,4", "--json", "--bootstrap", "400").stdout
    )
    for key in ("pass_hat_k", "pass_at_k", "c_over_n", "generalisation_pass_hat_1", "tool_error_rate", "abort_rate"):
        assert again[key] == s[key], key
    assert again["subsets"]["unseen"]["pass_at_k"] == s["subsets"]["unseen"]["pass_at_k"]
    assert again["ci"] == s["ci"]
    text = longhaul("eval", "summarize", str(results), "--k", "1,4").stdout
    assert "pass^4" in text and "pass@4" in text and "100/200" in text and "generalisation pass^1" in text
    too_big = longhaul("eval", "summarize", str(results), "--k", "8", check=False)
    assert too_big.returncode == 2 and "exceeds the trials" in too_big.stderr


def test_dead_endpoint_aborts_the_evaluation_without_a_summary(spec_file, tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    proc = longhaul(
        "eval",
        "--spec",
        str(spec_file),
        "--policy-url",
        url,
        "--user-url",
        url,
        "--tasks",
        "0,1",
        "--retries",
        "2",
        "--timeout",
        "2",
        "-o",
        str(tmp_path / "dead"),
        "--no-progress",
        check=False,
    )
    assert proc.returncode == 1
    assert "evaluation aborted" in proc.stderr and "failed after 2 attempts" in proc.stderr
    assert not (tmp_path / "dead" / "summary.json").exists()


def test_missing_endpoints_are_a_usage_error():
    proc = longhaul("eval", "--no-progress", check=False)
    assert proc.returncode == 2 and "--policy-url" in proc.stderr


def test_replay_gold_cli():
    proc = longhaul("env", "replay-gold")
    assert proc.stdout.strip().splitlines()[-1] == "50/50"
    doc = json.loads(longhaul("env", "replay-gold", "--tasks", "0,3", "--json").stdout)
    assert doc["passed"] == 2 and set(doc["tasks"]) == {"0", "3"}
    silent = longhaul("env", "replay-gold", "--tasks", "3,5", "--no-communicate", check=False)
    assert silent.returncode == 1 and silent.stdout.strip().splitlines()[-1] == "1/2"
    bad = longhaul("env", "replay-gold", "--tasks", "77", check=False)
    assert bad.returncode == 2 and "unknown airline task id" in bad.stderr


def test_env_tasks_and_floor_cli():
    doc = json.loads(longhaul("env", "tasks", "--json").stdout)
    assert doc["split"] == "seed_40_10" and len(doc["tasks"]) == 50
    by_id = {t["task_id"]: t for t in doc["tasks"]}
    assert by_id["0"]["subset"] == "covered_seen" and by_id["3"]["subsets"] == ["unseen", "test"]
    tau2 = json.loads(longhaul("env", "tasks", "--split", "tau2_official", "--json").stdout)
    assert sum(1 for t in tau2["tasks"] if "test" in t["subsets"]) == 20
    floor = json.loads(longhaul("env", "floor", "--json").stdout)
    assert floor["all"]["c_over_n"] == "23/50"
