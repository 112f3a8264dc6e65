"""`launch()` end to end with stand-in servers: start/health/stop by PID, stages, signals, exit codes, MLflow status.

The servers are real processes (`fake_vllm.py` speaking vLLM's argv and endpoints); the stages are replaced by
small functions so that each protocol path (done, SIGUSR1 → 75, SIGTERM → 143, failures) is exercised exactly.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from longhaul.launcher import EXIT_FAILED, EXIT_KILLED, EXIT_OK, EXIT_REQUEUE, EXIT_USAGE, supervisor
from longhaul.launcher.control import RequeueRequested
from longhaul.launcher.servers import probe_health
from longhaul.launcher.stages import run_command


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by us) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _stages(monkeypatch, grpo, ev):
    mod = sys.modules[__name__]
    monkeypatch.setattr(mod, "_grpo", grpo, raising=False)
    monkeypatch.setattr(mod, "_eval", ev, raising=False)

    # The stages are looked up by name: grpo and eval run in-process as stand-ins. grpo starts beside the servers'
    # start-up (STARTS_BESIDE_SERVERS): its stand-in waits for them first, as veRL's agent loop does.
    def grpo_stage(ctx, _stage):
        ctx.servers_ready()
        mod._grpo(ctx)

    monkeypatch.setattr(supervisor, "STAGES", {"grpo": grpo_stage, "eval": lambda ctx, _stage: mod._eval(ctx)})


def _server_pids(log: Path) -> list[int]:
    return [json.loads(line)["pid"] for line in log.read_text().splitlines() if '"argv"' in line]


def _mlflow_status(run_dir: Path) -> str:
    from mlflow.tracking import MlflowClient

    info = json.loads((run_dir / "mlflow_run.json").read_text())
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    return client.get_run(info["run_id"]).info.status


def test_runs_stages_with_healthy_servers_then_stops_them(setup, capsys):
    s = setup
    seen = {}

    def grpo(ctx):
        seen["sim"] = probe_health(ctx.simulator_base_url.removesuffix("/v1") + "/health")
        pol = ctx.policy_server()
        seen["policy"] = probe_health(pol.plan.health_url)
        seen["env"] = (ctx.env["MLFLOW_RUN_ID"], ctx.env["LONGHAUL_SIMULATOR_BASE_URL"])
        s["calls"].append("grpo")

    def ev(ctx):
        s["calls"].append("eval")

    _stages(s["monkeypatch"], grpo, ev)
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"])
    assert rc == EXIT_OK
    assert s["calls"] == ["grpo", "eval"]
    assert seen["sim"] and seen["policy"]
    assert seen["env"][0] == json.loads((s["run_dir"] / "mlflow_run.json").read_text())["run_id"]
    pids = _server_pids(s["log"])
    assert len(pids) == 2  # simulator + policy, each started once
    assert not any(_pid_alive(p) for p in pids)
    assert _mlflow_status(s["run_dir"]) == "FINISHED"
    for name in ("grpo", "eval"):
        assert (s["run_dir"] / ".longhaul" / "stages" / f"{name}.done").is_file()
    assert "fake vllm: ready" in (s["run_dir"] / "logs" / "simulator.log").read_text()
    out = capsys.readouterr().out
    # Server output goes to the run's log files only; the console says where they are.
    assert "fake vllm: ready" not in out
    assert f"(log: {s['run_dir'] / 'logs' / 'simulator.log'})" in out
    argv = json.loads(s["log"].read_text().splitlines()[0])["argv"]
    assert "--served-model-name" in argv

    # Started again (requeue/restart): finished stages are skipped, no server is started.
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"])
    assert rc == EXIT_OK and s["calls"] == ["grpo", "eval"]
    assert len(_server_pids(s["log"])) == 2


def test_sigusr1_saves_and_exits_requeue(setup):
    s = setup

    def grpo(ctx):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        deadline = time.monotonic() + 20
        while not ctx.control.checkpoint.is_set():
            assert time.monotonic() < deadline, "SIGUSR1 never reached the stage"
            time.sleep(0.05)
        (ctx.checkpoint_dir / "latest_checkpointed_iteration.txt").parent.mkdir(parents=True, exist_ok=True)
        (ctx.checkpoint_dir / "latest_checkpointed_iteration.txt").write_text("1\n")
        raise RequeueRequested("grpo step 2")

    _stages(s["monkeypatch"], grpo, lambda ctx: s["calls"].append("eval"))
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"])
    assert rc == EXIT_REQUEUE
    assert s["calls"] == []  # eval did not run
    assert not (s["run_dir"] / ".longhaul" / "stages" / "grpo.done").exists()
    assert not any(_pid_alive(p) for p in _server_pids(s["log"]))
    assert _mlflow_status(s["run_dir"]) == "SCHEDULED"
    assert signal.getsignal(signal.SIGUSR1) is not None  # handlers restored (not ours)


def test_sigusr1_while_the_eval_stage_starts_its_server_requeues(setup):
    """The pre-limit signal can arrive while the evaluation's policy server starts (seen in CI: short training
    steps, then eval): that is a checkpoint request like any other (exit 75, requeue), never a kill (130)."""
    s = setup

    def ev(ctx):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        ctx.policy_server()  # the fake server takes FAKE_VLLM_DELAY s to answer: the signal lands in the wait
        s["calls"].append("eval finished")

    _stages(s["monkeypatch"], lambda ctx: s["calls"].append("grpo"), ev)
    env = {**s["env"], "FAKE_VLLM_DELAY": "4"}
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=env)
    assert rc == EXIT_REQUEUE
    assert s["calls"] == ["grpo"]
    assert (s["run_dir"] / ".longhaul" / "stages" / "grpo.done").exists()
    assert not (s["run_dir"] / ".longhaul" / "stages" / "eval.done").exists()
    assert not any(_pid_alive(p) for p in _server_pids(s["log"]))
    assert _mlflow_status(s["run_dir"]) == "SCHEDULED"


def test_sigterm_stops_cleanly_and_marks_killed(setup):
    s = setup

    def grpo(ctx):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        while True:
            ctx.control.check()
            time.sleep(0.05)

    _stages(s["monkeypatch"], grpo, lambda ctx: s["calls"].append("eval"))
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"])
    assert rc == EXIT_KILLED
    assert s["calls"] == []
    assert not any(_pid_alive(p) for p in _server_pids(s["log"]))
    assert _mlflow_status(s["run_dir"]) == "KILLED"


def test_server_start_failure_names_the_server_and_its_log(setup, capsys):
    s = setup
    _stages(s["monkeypatch"], lambda ctx: s["calls"].append("grpo"), lambda ctx: None)
    env = {**s["env"], "FAKE_VLLM_FAIL": "1"}
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=env)
    out = capsys.readouterr().out
    assert rc == EXIT_FAILED and s["calls"] == []
    assert "server exited with code 3" in out and "simulated start-up failure" in out
    assert _mlflow_status(s["run_dir"]) == "FAILED"


def test_spec_not_matching_the_job_is_refused(setup, capsys):
    s = setup
    env = {**s["env"], "LONGHAUL_RUN_NAME": "smoke-00000000"}
    assert supervisor.launch(s["spec"], "local", s["run_dir"], environ=env) == EXIT_USAGE
    assert "does not match LONGHAUL_RUN_NAME" in capsys.readouterr().out
    assert supervisor.launch(s["spec"], "local", s["run_dir"], stage="sft", environ=s["env"]) == EXIT_USAGE


def test_policy_server_reloads_weights_in_place(setup, tmp_path):
    from longhaul.launcher.servers import PolicyServer
    from longhaul.render.plan import render_plan
    from longhaul.spec import load_spec

    s = setup
    plan = render_plan(load_spec(s["spec"]), "local", str(s["run_dir"]), server_python=s["env"]["LONGHAUL_VLLM_PYTHON"])
    server = PolicyServer(plan.policy_server, s["env"], tmp_path / "logs")
    model = tmp_path / "step1"
    model.mkdir()
    (model / "config.json").write_text("{}")
    try:
        server.start()
        server.wait_healthy()
        server.serve_weights(model, "step 1")
        assert server.updates[-1]["how"] == "reload" and server.serving == "step 1"
        posts = [json.loads(line) for line in s["log"].read_text().splitlines() if '"post"' in line]
        assert posts[0]["path"] == "/collective_rpc"
        assert posts[0]["body"] == {"method": "reload_weights", "kwargs": {"weights_path": str(model.resolve())}}
        assert json.loads(s["log"].read_text().splitlines()[0])["env_dev_mode"] == "1"
        # A dead server is restarted on the new weights instead.
        server.process.stop()
        server.serve_weights(model, "step 1 again")
        assert server.updates[-1]["how"] == "restart"
        argv = json.loads([ln for ln in s["log"].read_text().splitlines() if '"argv"' in ln][-1])["argv"]
        assert argv[argv.index("--model") + 1] == str(model)
    finally:
        server.stop()
    assert not any(_pid_alive(p) for p in _server_pids(s["log"]))


def test_checkpoint_request_stops_the_verl_stage_for_requeue(tmp_path):
    """veRL has no "save now" hook: on SIGUSR1 the stage is stopped (SIGTERM to its group) and the job requeues
    from the newest periodic checkpoint."""
    from longhaul.launcher.control import StopControl
    from longhaul.render.plan import StagePlan

    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('stopping', flush=True), sys.exit(143)))\n"
        "print('training', flush=True)\n"
        "time.sleep(30)\n"
    )
    control = StopControl()
    threading.Timer(1.0, control.request_checkpoint).start()
    with pytest.raises(RequeueRequested):
        run_command(StagePlan("grpo", (sys.executable, str(child))), dict(os.environ), tmp_path, control, sys.stdout)
    assert "stopping" in (tmp_path / "logs" / "grpo.log").read_text()
