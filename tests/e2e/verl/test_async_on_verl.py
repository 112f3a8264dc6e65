"""veRL's asynchronous trainer end to end on CPU (#33): `longhaul run <spec> --stage grpo` with
`spec.algorithm.trainer.mode: colocate_async` — veRL's real `main_ppo` (the v1 `PPOTrainerColocateAsync`), its vLLM
rollout on vLLM's CPU build, longhaul's agent loop — against a scripted user simulator (`support.fault_user_sim`)
that answers at once, so a conversation in flight is nearly always a policy generation.

How a partial rollout is made to happen: colocate_async generates only between a step's weight update and the end
of the next step's sampling (veRL pauses the engine for training), and the simulator here answers at once, so a
conversation in flight is nearly always a policy generation. Two warm-up groups keep prompts in flight from the
start: the steps after the first sample at once and end by aborting the generations of the prompts submitted since
(veRL logs "Aborted N requests"), which resume with the new weights after the update, so the next batches hold
turns that span two policy versions (measured: aborts of 2 and 3 requests, spans 2 at steps 2 and 3 of 4; seven
steps with four warm-up groups proved the same in ~70 s more of CI's critical path) — the trajectory trace
records each turn's (`policy_version`) and veRL's step metrics count them (`trajectory_spans`).
(A batch whose trajectories
generated no token at all — every customer stopping before the agent spoke — fails in veRL's rollout-correction
metrics, "response_mask must contain at least one valid token": docs/async-modes.md.)

One trainer run for the module; the tests read what it left. Needs the tiny policy (`longhaul tiny build`).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from .conftest import SPEC, run_grpo_stage

pytestmark = [pytest.mark.verl, pytest.mark.demo, pytest.mark.slow]

TRAIN = [0, 1, 2, 4, 5, 6]
TEST = [3, 10]
STEPS = 4
#: Prompt groups submitted before the first step (beyond step 1's): prompts in flight from the start.
WARMUP = 2
ABORTED = re.compile(r"Aborted (\d+) requests")


def _spec_doc(sim_url: str) -> dict:
    doc = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    doc["metadata"]["name"] = "async-smoke"
    s = doc["spec"]
    s["stages"] = ["grpo"]
    s["user_simulator"].update(placement="external", url=sim_url)
    s["environment"].update(
        split={"preset": "explicit", "train": TRAIN, "test": TEST}, max_turns=8, max_tokens_per_turn=64
    )
    s["algorithm"].update(
        group_size=2,
        train_batch_size=1,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=2,
        total_steps=STEPS,
        save_freq=STEPS,
        test_freq=-1,
        trainer={"mode": "colocate_async", "warmup_batches": WARMUP},
    )
    return doc


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """One colocate_async `longhaul run --stage grpo`; returns the run's results and its training traces."""
    r = run_grpo_stage(tmp_path_factory.mktemp("verl_async"), TRAIN + TEST, [], _spec_doc)
    log = r.dir / "logs" / "grpo.log"
    r.log = log.read_text() if log.exists() else ""
    r.traces = [
        json.loads(line)
        for f in sorted((r.dir / "rollouts").rglob("*.jsonl"))
        if "failures" not in f.parts
        for line in f.read_text().splitlines()
        if line
    ]
    return r


def _tail(r) -> str:
    return r.out[-3000:] + "\n--- grpo.log ---\n" + r.log[-5000:]


def test_the_async_trainer_trains_every_step(async_run):
    r = async_run
    assert r.rc == 0, _tail(r)
    overrides = (r.dir / "logs" / "hydra" / ".hydra" / "overrides.yaml").read_text()
    assert "trainer.v1.trainer_mode=colocate_async" in overrides
    assert f"trainer.v1.colocate_async.num_warmup_batches={WARMUP}" in overrides
    steps = [int(m) for m in re.findall(r"\[grpo\] step (\d+)/\d+:", r.out)]
    assert steps == list(range(1, STEPS + 1)), _tail(r)


def test_a_generation_aborted_at_a_weight_update_resumes_with_the_new_weights(async_run):
    """veRL aborted in-flight generations at the end of sampling; a trace holds a turn generated across two or
    more policy versions (begun with older weights, finished with newer ones), as one turn."""
    r = async_run
    assert r.rc == 0, _tail(r)
    aborted = [int(n) for n in ABORTED.findall(r.log)]
    assert aborted and max(aborted) >= 1, f"no generation was in flight at a weight update: {aborted}"
    resumed = [
        (t["step"], turn["index"], turn["policy_version"])
        for t in r.traces
        if t.get("trajectory")
        for turn in t["trajectory"]["turns"]
        if turn.get("policy_version") and turn["policy_version"][1] > turn["policy_version"][0]
    ]
    assert resumed, [t["trajectory"]["turns"] for t in r.traces if t.get("trajectory")][:4]
    # the trajectory's span (veRL's min/max_global_steps) covers its turns'
    for t in r.traces:
        versions = [turn["policy_version"] for turn in (t.get("trajectory") or {}).get("turns", [])]
        if versions:
            span = t["weights_version"]
            assert span["min_global_steps"] <= min(v[0] for v in versions)
            assert span["max_global_steps"] >= max(v[1] for v in versions)


def test_staleness_is_in_the_step_metrics_and_on_the_console(async_run):
    from mlflow.tracking import MlflowClient

    r = async_run
    assert r.rc == 0, _tail(r)
    client = MlflowClient(f"sqlite:///{r.dir / 'mlflow.db'}")
    run_id = json.loads((r.dir / "mlflow_run.json").read_text())["run_id"]
    spans = {m.step: m.value for m in client.get_metric_history(run_id, "training/off_policy/trajectory_spans/max")}
    stale = {
        m.step: m.value for m in client.get_metric_history(run_id, "training/off_policy/trajectory_staleness_worst/max")
    }
    assert sorted(spans) == sorted(stale) == list(range(1, STEPS + 1))
    assert max(spans.values()) >= 2 and max(stale.values()) >= 1, (spans, stale)
    assert re.search(r"\[grpo\] step \d+/\d+:.* stale \d+  spans [2-9]", r.out), r.out[-3000:]
    # longhaul's async replay buffer counts failed groups every step, as the sync one does (none fail here).
    for name in ("rollout/dropped_groups", "rollout/failed_trajectories"):
        counts = {m.step: m.value for m in client.get_metric_history(run_id, name)}
        assert sorted(counts) == list(range(1, STEPS + 1)) and set(counts.values()) == {0}, (name, counts)
