"""veRL's real trainer with faults injected, end to end: `longhaul run <spec> --stage grpo` (the real launcher, which
runs veRL's `main_ppo`, v1 sync trainer, on its CPU platform with longhaul's agent loop and replay buffer) against
a user simulator that misbehaves per task (`support.fault_user_sim`):

* the first task it sees always gets HTTP 500/503, past the client's retries → its trajectories fail, its group is
  dropped and refilled;
* the second opens with a message so long that the first prompt is over `environment.max_prompt_tokens` → same;
* the third opens with ###STOP### → an episode with no generation, which must still train (graded);
* every later one answers normally.

One trainer run for the module (a step with refills); the tests read what it left: MLflow (veRL's own metrics and
the replay buffer's accounting), the rollout traces, the requests the simulator received (seeds), the checkpoint,
and the weights veRL's vLLM rollout served at each sync (full-weight training: `support.vllm_sync_probe`).
Needs the tiny policy (`longhaul tiny build`). A few minutes on a 2-core machine.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from support.fault_user_sim import Fault
from support.vllm_sync_probe import read_sync_log, sync_probe_env, weights_sum

from .conftest import ROOT, SPEC, run_grpo_stage

pytestmark = [pytest.mark.verl, pytest.mark.demo, pytest.mark.slow]

TRAIN = [0, 1, 2, 4, 5, 6]  # two failing groups + the batch of two, with slack
TEST = [3, 10]
GROUP_SIZE = 2
BATCH = 2
#: In the order the simulator hands them out to the tasks it sees. Whatever order veRL's shuffled loader gives,
#: the first two tasks dispatched fail, and each dropped group is refilled with exactly one prompt: step 1 sees
#: exactly four tasks (two dropped, then the ###STOP### one and a normal one, which make the batch).
FAULTS = [Fault.SERVER_ERROR, Fault.OVERLONG, Fault.STOP_AT_ONCE]
FAILING = {Fault.SERVER_ERROR: "user_simulator_error", Fault.OVERLONG: "prompt_over_budget"}
#: Where tests/support/vllm_sync_probe.py records what the actor sent and veRL's vLLM rollout served at each sync.
SYNC_LOG = "sync.jsonl"


def _spec_doc(sim_url: str) -> dict:
    doc = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    s = doc["spec"]
    s["stages"] = ["grpo"]
    s["user_simulator"].update(placement="external", url=sim_url)
    s["environment"].update(split={"preset": "explicit", "train": TRAIN, "test": TEST}, max_turns=3)
    # one prompt group per optimizer step (two per step, as in smoke.yaml), one group per micro batch: veRL
    # asserts that a mini batch (ppo_mini_batch_size × group_size samples) splits into whole micro batches
    s["algorithm"].update(
        group_size=GROUP_SIZE,
        train_batch_size=BATCH,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=GROUP_SIZE,
        total_steps=1,
        save_freq=1,
        test_freq=-1,
    )
    return doc


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    """One `longhaul run --stage grpo` against the fault-injecting simulator; returns a namespace of results."""
    base = tmp_path_factory.mktemp("verl_faults")
    r = run_grpo_stage(base, TRAIN + TEST, FAULTS, _spec_doc, extra_env=sync_probe_env(base / SYNC_LOG))
    r.sync_log = base / SYNC_LOG
    return r


def _log_tail(r, n: int = 6000) -> str:
    log = r.dir / "logs" / "grpo.log"
    return r.out[-3000:] + "\n--- grpo.log ---\n" + (log.read_text()[-n:] if log.exists() else "(none)")


def _traces(root: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(root.glob("*.jsonl")) for line in f.read_text().splitlines() if line]


def test_step_completes_with_faults(faulty_run):
    r = faulty_run
    assert r.rc == 0, _log_tail(r)
    assert (r.dir / ".longhaul" / "stages" / "grpo.done").is_file()
    assert "stage grpo: done" in r.out
    # every fault was handed out; the step took the two failing prompts and exactly one refill for each
    assert sorted(r.sim.assigned.values()) == sorted([*FAULTS, *[Fault.NORMAL] * (2 + BATCH - len(FAULTS))])
    assert all(req.task_id is not None for req in r.sim.requests), "a request named no known task"


def test_verl_logged_step_1_with_the_failure_accounting(faulty_run):
    """veRL's metrics for step 1 are in MLflow: the batch (with the no-generation ###STOP### trajectory) passed
    veRL's `_compute_metrics` / debug metrics; the replay buffer counted exactly the failures injected."""
    from mlflow.tracking import MlflowClient

    r = faulty_run
    assert r.rc == 0, _log_tail(r)
    client = MlflowClient(f"sqlite:///{r.dir / 'mlflow.db'}")
    run = client.get_run(json.loads((r.dir / "mlflow_run.json").read_text())["run_id"])
    assert run.info.status == "FINISHED"

    def at_step_1(key: str) -> float:
        hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert 1 in hist, f"{key} not logged at step 1 (logged: {sorted(run.data.metrics)[:80]})"
        return hist[1]

    for key in ("critic/score/mean", "actor/pg_loss", "response_length/mean", "timing_s/step"):
        at_step_1(key)
    failing_tasks = [t for f in FAILING for t in r.sim.tasks_with(f)]
    dropped = at_step_1("rollout/dropped_groups")
    failed = at_step_1("rollout/failed_trajectories")
    assert dropped == len(failing_tasks) == 2
    # no session of a failing group finishes: each one meets the same fault
    assert failed == len(failing_tasks) * GROUP_SIZE
    assert at_step_1("training/rollout_failure/evicted_samples") == dropped


def test_traces_hold_the_failures_and_the_stop_trajectory(faulty_run):
    from longhaul.agentloop.context import derive_rollout_seed

    r = faulty_run
    assert r.rc == 0, _log_tail(r)
    step = r.dir / "rollouts" / "step_1"
    failures = _traces(step / "failures")
    by_task = defaultdict(list)
    for rec in failures:
        assert rec["trajectory"] is None and rec["step"] == 1 and rec["error"]
        by_task[rec["task_id"]].append(rec)
    for fault, reason in FAILING.items():
        (task,) = r.sim.tasks_with(fault)
        assert task in by_task, f"no failure trace for {fault} task {task}"
        assert {rec["failed"] for rec in by_task[task]} == {reason}
    assert set(by_task) == {t for f in FAILING for t in r.sim.tasks_with(f)}

    graded = _traces(step)
    (stop_task,) = r.sim.tasks_with(Fault.STOP_AT_ONCE)
    stops = [rec for rec in graded if rec["task_id"] == stop_task]
    assert len(stops) == GROUP_SIZE
    for rec in stops:
        assert rec["termination"] == "user_stop"
        assert rec["tokens"]["generated"] == 0 and rec["tokens"]["response"] == 1
        assert rec["trajectory"]["task_id"] == stop_task and "outcome" in rec["reward"]
        assert set(rec["weights_version"].values()) == {0}  # step 1 rolls out with the initial weights
    # the batch: two full groups, none of them a failing task
    assert len(graded) == BATCH * GROUP_SIZE
    assert not {rec["task_id"] for rec in graded} & set(by_task)
    # every trajectory's seed is the one derived from (step, prompt, session) and recorded
    seed_base = r.doc["spec"]["algorithm"]["seed"]
    for rec in graded + failures:
        assert rec["seed"] == derive_rollout_seed(
            seed_base, step=1, index=rec["index"], session=rec["session"], validate=False
        )


def test_each_session_of_a_group_sends_its_own_seed(faulty_run):
    from longhaul.clients.openai_compat import RetryPolicy

    r = faulty_run
    assert r.rc == 0, _log_tail(r)
    seeds = defaultdict(set)
    for req in r.sim.requests:
        assert isinstance(req.seed, int), req
        seeds[req.task_id].add(req.seed)
    graded = {rec["task_id"]: rec for rec in _traces(r.dir / "rollouts" / "step_1")}
    for task in graded:  # the tasks of the trained batch: every session ran
        assert len(seeds[task]) == GROUP_SIZE, (task, seeds[task])
    traced = defaultdict(set)
    for rec in _traces(r.dir / "rollouts" / "step_1") + _traces(r.dir / "rollouts" / "step_1" / "failures"):
        traced[rec["task_id"]].add(rec["seed"])
    for task, got in traced.items():
        assert got <= seeds[task], (task, got, seeds[task])
    all_seeds = [s for group in seeds.values() for s in group]
    assert len(all_seeds) == len(set(all_seeds)), "two groups shared a seed"
    # each session of the server-error task sent its own seed, and gave up after the client's retries
    (err_task,) = r.sim.tasks_with(Fault.SERVER_ERROR)
    attempts = Counter(req.seed for req in r.sim.requests if req.task_id == err_task)
    assert len(attempts) == GROUP_SIZE and set(attempts.values()) == {RetryPolicy().attempts}, attempts
    assert {req.status for req in r.sim.requests if req.task_id == err_task} == {500, 503}


def test_checkpoint_of_step_1_saved(faulty_run):
    from longhaul.checkpoints import saved_steps

    r = faulty_run
    assert r.rc == 0, _log_tail(r)
    ckpt = r.dir / "checkpoints"
    assert saved_steps(ckpt) == [1]
    assert (ckpt / "global_step_1").is_dir()
    assert "checkpoints saved by veRL: steps [1]" in r.out


def test_the_rollout_serves_the_actors_weights_after_every_sync(faulty_run):
    """veRL's vLLM rollout (vLLM's CPU build, shared-memory weight transfer) serves exactly the weights the actor
    sent at every sync (sums per sync, float64, of what the trainer's sender sent and of what vLLM then serves); vLLM
    starts on dummy weights, the first sync brings the initial policy, and the update changes what is served."""
    r = faulty_run
    assert r.rc == 0, _log_tail(r)
    sent, served = read_sync_log(r.sync_log)
    steps = r.doc["spec"]["algorithm"]["total_steps"]
    base = ROOT / r.doc["spec"]["policy"]["model"]["path"]
    assert len(sent) == len(served) == steps + 1, (len(sent), len(served))  # the initial sync, then one per update
    for i, (a, b) in enumerate(zip(sent, served, strict=True)):
        assert b.weights == pytest.approx(a.weights_without_tied_head(base), rel=1e-9), i
    assert sent[0].weights_without_tied_head(base) == pytest.approx(weights_sum(base), rel=1e-9)
    assert len({round(b.weights, 6) for b in served}) == len(served)  # each update moved what is served
