"""One evaluation summary: `longhaul eval`, `longhaul eval summarize` and the launcher's eval stage all compute it
with `longhaul.eval.evaluate.summarize_evaluation`, the bootstrap seeded with the first evaluation seed, so the same
records give the same summary, CIs and the do-nothing agent's floor included (the stage once left the floor out).
And `longhaul eval` finds the endpoints (URLs, API keys) under the variable names the launcher and the Kubernetes
renderer set.

No endpoint is contacted: `evaluate` is replaced by one that writes deterministic records for the plan's trials,
and `ChatClient` by one that records how it was built.
"""

from __future__ import annotations

import io
import json
import random
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from longhaul import constants as C
from longhaul.cli import app
from longhaul.eval import evaluate as eval_mod
from longhaul.eval.evaluate import summarize_evaluation
from longhaul.eval.metrics import bootstrap_seed
from longhaul.launcher import evaluate as stage_mod
from longhaul.launcher.context import StageResults
from longhaul.launcher.supervisor import build_server_env
from longhaul.layout import Paths
from longhaul.render.plan import render_plan
from longhaul.spec import load_spec
from longhaul.spec.load import build_experiment

ROOT = Path(__file__).resolve().parents[3]
ALGORITHM_SEED = 7  # what the stage used to seed its bootstrap with
EVAL_SEEDS = [3, 5]


class FakeClient:
    """Stands in for `longhaul.clients.openai_compat.ChatClient`; records (role, url, model, api key)."""

    made: list[tuple[str, str, str, str | None]] = []

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, role: str = "", **_: Any) -> None:
        FakeClient.made.append((role, base_url, model, api_key))

    async def aclose(self) -> None:
        pass

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


async def fake_evaluate(plan, *, split, results_path, on_done=None, **_: Any) -> list[dict[str, Any]]:  # noqa: ANN001
    """Records for every trial of the plan, varied enough that differently seeded bootstraps disagree."""
    records = []
    for tid, trial, seed in plan.trials():
        records.append(
            {
                "task_id": tid,
                "trial": trial,
                "seed": seed,
                "success": trial < (int(tid) * 3) % 5,
                "scored": True,
                "subset": split.primary(tid),
                "subsets": split.labels(tid),
                "termination": "done",
                "aborted": trial == 1 and int(tid) % 3 == 0,
                "num_turns": 2 + trial,
                "num_tool_calls": 3,
                "num_tool_errors": int(tid) % 2,
                "num_unknown_tool_calls": 0,
            }
        )
    Path(results_path).write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"].setdefault("algorithm", {})["seed"] = ALGORITHM_SEED
    doc["spec"]["evaluation"]["seeds"] = EVAL_SEEDS
    spec = tmp_path / "smoke.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    exp = load_spec(spec)
    plan = render_plan(exp, "local", str(tmp_path / "run"))
    FakeClient.made = []
    monkeypatch.setattr("longhaul.clients.openai_compat.ChatClient", FakeClient)
    monkeypatch.setattr(eval_mod, "evaluate", fake_evaluate)
    return SimpleNamespace(tmp=tmp_path, spec=spec, exp=exp, plan=plan)


def _run_stage(s: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The launcher's eval stage on the initial policy (step 0), MLflow logging replaced by no-ops."""
    monkeypatch.setattr(stage_mod, "saved_steps", lambda _dir: [])
    monkeypatch.setattr("longhaul.tracking.runs.log_evaluation", lambda *a, **kw: None)
    monkeypatch.setattr("longhaul.tracking.runs.log_selection", lambda *a, **kw: None)
    eval_dir = s.tmp / "run" / "eval"
    server = s.plan.policy_server
    ctx = SimpleNamespace(
        exp=s.exp,
        echo=io.StringIO(),
        checkpoint_dir=s.tmp / "run" / "checkpoints",
        control=SimpleNamespace(requested=False, checkpoint=threading.Event(), check=lambda: None),
        paths=Paths.under(str(s.tmp / "run")),  # eval_dir: run / eval
        policy_server=lambda: SimpleNamespace(
            serving="base", base_url=server.base_url, served_model_name=server.served_model_name
        ),
        simulator_base_url=s.plan.simulator_base_url,
        simulator_model=s.exp.spec.user_simulator.model.name,
        results=StageResults(),
        run_id="run",
        tracking_uri=None,
    )
    stage_mod.run_eval_stage(ctx)
    return json.loads((eval_dir / "step_0" / "summary.json").read_text())


def _run_cli_eval(s: SimpleNamespace, env: dict[str, str]) -> dict[str, Any]:
    out = s.tmp / "cli-eval"
    res = CliRunner().invoke(app, ["eval", "--spec", str(s.spec), "--output", str(out), "--no-progress"], env=env)
    assert res.exit_code == 0, res.output
    return json.loads((out / "summary.json").read_text())


def _without(summary: dict[str, Any], *drop: str) -> dict[str, Any]:
    """The summary less the caller's own keys (run info, timing, traces)."""
    return {k: v for k, v in summary.items() if k not in drop}


def test_cli_and_stage_give_the_same_summary_for_the_same_records(setup, monkeypatch) -> None:
    s = setup
    ev = s.exp.spec.evaluation
    stage = _run_stage(s, monkeypatch)
    cli = _run_cli_eval(s, {**build_server_env(s.exp, s.plan)})
    assert stage["ci"]["pass_hat_k"] and stage["tasks"] > 3
    assert stage["null_agent_floor"] is not None and all("null_agent_floor" in b for b in stage["subsets"].values())
    assert _without(cli, "run") == _without(stage, "checkpoint_step", "seconds", "traces")

    # Both are the shared function seeded with the first evaluation seed (not spec.algorithm.seed, as the stage
    # once was): on these records the two seeds give different CIs, so the test tells them apart.
    records = [
        json.loads(line) for line in (s.tmp / "run" / "eval" / "step_0" / "results.jsonl").read_text().splitlines()
    ]
    assert bootstrap_seed(ev.seeds) == EVAL_SEEDS[0]

    def summary(seed: int) -> dict[str, Any]:
        return summarize_evaluation(records, ev.k, bootstrap=ev.bootstrap_samples, confidence=ev.confidence, seed=seed)

    assert summary(ALGORITHM_SEED)["ci"] != summary(EVAL_SEEDS[0])["ci"]
    assert _without(stage, "checkpoint_step", "seconds", "traces") == summary(EVAL_SEEDS[0])

    # `longhaul eval summarize` re-scores the stage's results file to the same summary (its --seed: the first
    # evaluation seed).
    k = ",".join(str(x) for x in ev.k)
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "summarize",
            str(s.tmp / "run" / "eval" / "step_0" / "results.jsonl"),
            "--json",
            "--k",
            k,
            "--bootstrap",
            str(ev.bootstrap_samples),
            "--confidence",
            str(ev.confidence),
            "--seed",
            str(EVAL_SEEDS[0]),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == _without(stage, "checkpoint_step", "seconds", "traces")


def test_cli_and_stage_evaluate_through_one_driver(setup, monkeypatch) -> None:
    """Both run their trials through `longhaul.eval.driver.run_evaluation`: the same plan, limits, split, spec and
    run facts (the stage adds the checkpoint step); what differs is where the records go and the retry budget."""
    from longhaul.eval import driver

    s, jobs = setup, []
    real = driver.run_evaluation
    monkeypatch.setattr(driver, "run_evaluation", lambda job, on_done=None: jobs.append(job) or real(job, on_done))
    _run_stage(s, monkeypatch)
    _run_cli_eval(s, {**build_server_env(s.exp, s.plan)})
    stage, cli = jobs
    assert (stage.plan, stage.limits, stage.split.name) == (cli.plan, cli.limits, cli.split.name)
    assert stage.spec == cli.spec and stage.run_info == {**cli.run_info, "checkpoint_step": 0}
    assert (stage.policy.base_url, stage.user.base_url) == (cli.policy.base_url, cli.user.base_url)
    assert stage.results_path.parent == s.tmp / "run" / "eval" / "step_0" and cli.trajectories_path is not None


def test_longhaul_eval_reads_what_the_launcher_sets(setup) -> None:
    """Under the launcher (its stage environment) `longhaul eval` needs no URL options; API keys come from the
    variables the Kubernetes renderer fills from Secrets."""
    s = setup
    env = build_server_env(s.exp, s.plan)
    assert env[C.ENV_POLICY_BASE_URL] == s.plan.policy_server.base_url
    assert env[C.ENV_SIMULATOR_BASE_URL] == s.plan.simulator_base_url != ""
    _run_cli_eval(s, {**env, C.ENV_POLICY_API_KEY: "policy-key", C.ENV_USER_SIM_API_KEY: "sim-key"})
    made = {role: rest for role, *rest in FakeClient.made}
    assert made["policy"] == [env[C.ENV_POLICY_BASE_URL], env[C.ENV_POLICY_MODEL], "policy-key"]
    assert made["user simulator"] == [env[C.ENV_SIMULATOR_BASE_URL], env[C.ENV_SIMULATOR_MODEL], "sim-key"]


def test_the_simulator_key_variable_is_the_one_kubernetes_renders() -> None:
    from longhaul.render.kubernetes import render_kubernetes

    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["user_simulator"].update(
        placement="external", url="http://sim.example:8000/v1", api_key_secret={"name": "sim", "key": "api-key"}
    )
    objs = render_kubernetes(build_experiment(doc, "smoke.yaml"))
    names = {
        e["name"] for o in objs if o["kind"] == "Job" for e in o["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert C.ENV_USER_SIM_API_KEY in names


def test_longhaul_eval_without_urls_says_what_is_missing(setup) -> None:
    res = CliRunner().invoke(
        app,
        ["eval", "--spec", str(setup.spec), "--no-progress"],
        env={C.ENV_POLICY_BASE_URL: "", C.ENV_SIMULATOR_BASE_URL: ""},
    )
    assert res.exit_code == 2
    assert "--policy-url and --user-url missing" in res.output


def test_bootstrap_seed_is_the_first_evaluation_seed() -> None:
    assert bootstrap_seed([4, 1]) == 4
    with pytest.raises(ValueError, match="at least one seed"):
        bootstrap_seed([])
    assert random.Random(bootstrap_seed([4])).random() == random.Random(4).random()
