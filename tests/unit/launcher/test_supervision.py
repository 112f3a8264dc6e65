"""What the launcher does when things die under it: a server that crashes during a stage (restart within a budget,
then a clean failure), the launcher itself killed (its children die with it; leftovers are reaped by the next
launcher of the run, which holds the run directory's lock), a log that cannot be written (full disk).

Real processes throughout (`fake_vllm.py` speaks vLLM's argv and endpoints); stages are stand-ins.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from longhaul.launcher import EXIT_FAILED, EXIT_OK, supervisor
from longhaul.launcher.control import StopControl
from longhaul.launcher.files import LockBusy, exclusive_lock
from longhaul.launcher.processes import ENV_SUPERVISED_BY, ManagedProcess, find_supervised, kill_supervised
from longhaul.launcher.servers import ManagedServer, PolicyServer
from longhaul.launcher.stages import run_command
from longhaul.render.plan import StagePlan, render_plan
from longhaul.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait(pred, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def _server_starts(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if '"argv"' in line]


def _simulator_pid(log: Path) -> int:
    return [e["pid"] for e in _server_starts(log) if "longhaul/tiny-qwen2-user" in e["argv"]][-1]


def _stages(monkeypatch, grpo, ev=lambda ctx: None):
    mod = sys.modules[__name__]
    monkeypatch.setattr(mod, "_grpo", grpo, raising=False)
    monkeypatch.setattr(mod, "_eval", ev, raising=False)

    # The stages are looked up by name: grpo and eval run in-process as stand-ins; grpo's waits for the servers
    # it starts beside, as veRL's agent loop does.
    def grpo_stage(ctx, _stage):
        ctx.servers_ready()
        mod._grpo(ctx)

    monkeypatch.setattr(supervisor, "STAGES", {"grpo": grpo_stage, "eval": lambda ctx, _stage: mod._eval(ctx)})


def _crash_simulator(log: Path) -> None:
    pid = _simulator_pid(log)
    os.kill(pid, signal.SIGKILL)
    assert _wait(lambda: not _alive(pid))


# ------------------------------------------------------------------------------------------------ server crashes


def test_a_server_crash_restarts_the_server_and_the_stage(setup, capsys):
    s = setup
    attempts = []

    def grpo(ctx):
        attempts.append(_simulator_pid(s["log"]))
        if len(attempts) == 1:
            _crash_simulator(s["log"])
            raise ConnectionError("user simulator: connection refused (after retries)")

    _stages(s["monkeypatch"], grpo)
    assert supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"]) == EXIT_OK
    out = capsys.readouterr().out
    assert len(attempts) == 2 and attempts[0] != attempts[1]  # the stage ran again, against a new server
    assert "simulator server (pid" in out and "exited (killed by SIGKILL) during stage 'grpo'" in out
    assert "restarting it (1/2 restarts in this launch)" in out
    assert "stage grpo: starting again" in out
    assert not any(_alive(e["pid"]) for e in _server_starts(s["log"]))


def test_crashes_past_the_budget_fail_cleanly_with_how_to_resume(setup, capsys):
    s = setup
    attempts = []

    def grpo(ctx):
        attempts.append(1)
        _crash_simulator(s["log"])
        raise ConnectionError("user simulator: connection refused (after retries)")

    _stages(s["monkeypatch"], grpo)
    assert supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert len(attempts) == 1 + supervisor.MAX_SERVER_RESTARTS
    assert f"after {supervisor.MAX_SERVER_RESTARTS} restarts in this launch" in out
    assert "The checkpoints are intact; the newest complete one: none" in out and "start the run again" in out
    assert "Traceback" not in out
    assert not any(_alive(e["pid"]) for e in _server_starts(s["log"]))
    assert not (s["run_dir"] / ".longhaul" / "stages" / "grpo.done").exists()


def test_a_subprocess_stage_is_stopped_as_soon_as_a_server_dies(setup):
    s = setup
    plan = render_plan(load_spec(s["spec"]), "local", str(s["run_dir"]), server_python=s["env"]["LONGHAUL_VLLM_PYTHON"])
    server = ManagedServer(plan.servers[0], s["env"], s["tmp"] / "logs").start()
    server.wait_healthy()
    child = s["tmp"] / "stage.py"
    child.write_text("import time\nprint('training', flush=True)\ntime.sleep(120)\n")
    threading.Timer(1.0, server.process.send_signal, (signal.SIGKILL,)).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(
            supervisor.ServerCrashed, match=r"simulator server .* exited \(killed by SIGKILL\) during stage 'grpo'"
        ):
            run_command(
                StagePlan("grpo", (sys.executable, str(child))),
                dict(s["env"]),
                s["tmp"],
                StopControl(),
                sys.stdout,
                servers=[server],
            )
    finally:
        server.stop()
    assert time.monotonic() - t0 < 30


def test_a_policy_server_restarted_after_a_crash_serves_the_reloaded_weights(setup):
    s = setup
    plan = render_plan(load_spec(s["spec"]), "local", str(s["run_dir"]), server_python=s["env"]["LONGHAUL_VLLM_PYTHON"])
    server = PolicyServer(plan.policy_server, s["env"], s["tmp"] / "logs")
    model = s["tmp"] / "step1"
    model.mkdir()
    (model / "config.json").write_text("{}")
    try:
        server.start()
        server.wait_healthy()
        server.serve_weights(model, "step 1")
        assert server.updates[-1]["how"] == "reload"
        server.process.send_signal(signal.SIGKILL)
        assert _wait(lambda: server.crashed)
        server.restart()
        argv = _server_starts(s["log"])[-1]["argv"]
        assert argv[argv.index("--model") + 1] == str(model)
    finally:
        server.stop()


# ------------------------------------------------------------------------------------ the launcher killed


def test_the_run_directory_lock_refuses_a_second_launcher_and_dies_with_its_holder(setup, tmp_path, capsys):
    lock = tmp_path / "run" / ".longhaul" / "launcher.lock"
    with exclusive_lock(lock, "run directory X"):
        with pytest.raises(LockBusy, match=f"run directory X is in use by process {os.getpid()}"):
            with exclusive_lock(lock, "run directory X"):
                pass
        assert supervisor.launch(setup["spec"], "local", tmp_path / "run", environ=setup["env"]) == EXIT_FAILED
        assert "refused: run directory" in capsys.readouterr().out
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / "pipelines")!r})
        from longhaul.launcher.files import exclusive_lock
        with exclusive_lock({str(lock)!r}, "x"):
            print("held", flush=True)
            time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy):
            with exclusive_lock(lock, "x"):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with exclusive_lock(lock, "x"):  # the kernel released it with the holder
            pass
    finally:
        holder.kill()
        holder.wait()


#: A "launcher": starts a child the way the launcher does (ManagedProcess, main thread); the child (CHILD) starts a
#: grandchild in a session of its own (as Ray and vLLM do), then both sleep.
LAUNCHER = """
import os, sys, time
sys.path.insert(0, sys.argv[4])
from longhaul.launcher.processes import ENV_SUPERVISED_BY, ManagedProcess
env = {**os.environ, ENV_SUPERVISED_BY: sys.argv[1]}
# echo off: the child's own output ("[stage] <grandchild pid>") must not race this line on stdout (seen in CI)
quiet = open(os.devnull, "w")
p = ManagedProcess("stage", [sys.executable, "-c", sys.argv[3]], env, log_path=sys.argv[2], echo=quiet).start()
print(p.pid, flush=True)
time.sleep(120)
"""
CHILD = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(g.pid, flush=True)
time.sleep(120)
"""


def test_children_die_with_a_killed_launcher_and_leftovers_are_reaped(tmp_path):
    run_dir = tmp_path / "run"
    log = tmp_path / "stage.log"
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(run_dir), str(log), CHILD, str(ROOT / "pipelines")],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(launcher.stdout.readline())
    assert _wait(lambda: log.is_file() and log.read_text().strip())
    grandchild = int(log.read_text().split()[0])
    try:
        assert find_supervised(run_dir) == sorted([child, grandchild])
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert _wait(lambda: not _alive(child), 10), "the child outlived the launcher (no parent-death signal)"
        assert _alive(grandchild)  # in a session of its own: only the next launcher can find it
        assert kill_supervised(run_dir) == [grandchild]
        assert not _alive(grandchild) and find_supervised(run_dir) == []
        assert find_supervised(tmp_path / "other") == []
    finally:
        for pid in (child, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_launch_reaps_the_leftovers_of_a_killed_launcher(setup, capsys):
    s = setup
    run_dir = s["run_dir"].absolute()
    env = {**os.environ, ENV_SUPERVISED_BY: str(run_dir)}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)
    try:
        _stages(s["monkeypatch"], lambda ctx: None)
        assert supervisor.launch(s["spec"], "local", run_dir, environ=s["env"]) == EXIT_OK
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert (
            f"killed 1 leftover processes of an earlier launcher of this run (it died without stopping them): "
            f"pids {orphan.pid}" in capsys.readouterr().out
        )
    finally:
        orphan.kill()
        orphan.wait()


# ------------------------------------------------------------------------------------------------- full disk


def test_a_log_that_cannot_be_written_does_not_block_the_child(tmp_path):
    """/dev/full answers every write with ENOSPC: the child's output is still drained (no blocked pipe), the tail
    kept, the full disk noticed."""
    script = "import sys\nfor i in range(20000): print('x' * 40, i)\nprint('done')\n"
    p = ManagedProcess(
        "stage", [sys.executable, "-c", script], dict(os.environ), log_path="/dev/full", echo=open(os.devnull, "w")
    ).start()  # noqa: SIM115 - a sink
    assert p.wait(timeout=60) == 0
    assert p.tail().endswith("done") and p.no_space_seen
    assert "No space left on device" in str(p.log_error)


def test_a_full_disk_is_named_with_the_run_directory_and_what_to_do(setup, capsys):
    import errno
    import zipfile

    from longhaul.checkpoints import TRACKER_FILE, shard_dir, step_dir

    s = setup
    ckpt = s["run_dir"] / "checkpoints"
    d = shard_dir(ckpt, 1)
    (d / "huggingface").mkdir(parents=True)
    (d / "huggingface" / "config.json").write_text("{}")
    (d / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 1}')
    for f in (
        *(d / f"{k}_world_size_1_rank_0.pt" for k in ("model", "optim", "extra_state")),
        step_dir(ckpt, 1) / "data.pt",
    ):
        with zipfile.ZipFile(f, "w") as zf:
            zf.writestr("archive/data.pkl", b"x")
    (ckpt / TRACKER_FILE).write_text("1")

    def grpo(ctx):
        raise OSError(errno.ENOSPC, "No space left on device", str(ctx.checkpoint_dir / "global_step_2"))

    _stages(s["monkeypatch"], grpo)
    assert supervisor.launch(s["spec"], "local", s["run_dir"], environ=s["env"]) == EXIT_FAILED
    out = capsys.readouterr().out
    assert f"FAILED: no space left on device under the run directory {s['run_dir'].absolute()}" in out
    assert "the newest complete checkpoint, step 1, is intact" in out
    assert "then start the run again with `longhaul run SPEC`: it resumes from step 1" in out
    assert "Traceback" not in out
