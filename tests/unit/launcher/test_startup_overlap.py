"""veRL's trainer starts while the servers load (`STARTS_BESIDE_SERVERS`), every other stage once they serve, and a
server that fails to start stops a stage already running beside it; the agent loop's side of it, the wait for an
endpoint to serve (`longhaul.clients.ready`), against a real HTTP server that starts late.

The servers are real processes (tests/unit/launcher/fake_vllm.py, `FAKE_VLLM_DELAY` seconds before they listen).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from longhaul.clients.openai_compat import EndpointError, FaultKind
from longhaul.clients.ready import _SERVING, wait_from_env, wait_until_serving
from longhaul.constants import ENV_SERVER_WAIT_S
from longhaul.launcher import EXIT_FAILED, EXIT_OK, supervisor
from longhaul.launcher.servers import probe_health
from longhaul.launcher.stages import run_command_stage
from longhaul.render.plan import StagePlan
from support.net import free_port


def _health(ctx) -> bool:
    return probe_health(ctx.simulator_base_url.removesuffix("/v1") + "/health")


def test_the_trainer_starts_while_the_simulator_loads_and_eval_waits_for_it(setup, capsys):
    s = setup
    seen: dict[str, object] = {}

    def grpo(ctx, _stage):
        seen["grpo_at_start"] = _health(ctx)
        seen["wait_s"] = ctx.env.get(ENV_SERVER_WAIT_S)
        ctx.servers_ready()
        seen["grpo_after_wait"] = _health(ctx)

    def ev(ctx, _stage):
        seen["eval_at_start"] = _health(ctx)

    s["monkeypatch"].setattr(supervisor, "STAGES", {"grpo": grpo, "eval": ev})
    env = {**s["env"], "FAKE_VLLM_DELAY": "2"}
    assert supervisor.launch(s["spec"], "local", s["run_dir"], environ=env) == EXIT_OK
    out = capsys.readouterr().out
    assert seen == {"grpo_at_start": False, "wait_s": "30", "grpo_after_wait": True, "eval_at_start": True}
    # the stage started before the simulator answered its health check
    assert out.index("stage grpo: start") < out.index("simulator server healthy after")


def test_a_server_that_fails_to_start_stops_the_stage_running_beside_it(setup, capsys):
    s = setup
    marker = s["tmp"] / "trainer.pid"
    trainer = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(120)"

    def grpo(ctx, _stage):
        run_command_stage(ctx, StagePlan("grpo", ("python", "-c", trainer)))

    s["monkeypatch"].setattr(supervisor, "STAGES", {"grpo": grpo, "eval": lambda ctx, _stage: None})
    env = {**s["env"], "FAKE_VLLM_DELAY": "3"}
    # The simulator dies during its start-up, after the trainer has started beside it.
    wrapper = Path(env["LONGHAUL_VLLM_PYTHON"])
    failing = s["tmp"] / "failing-python"
    failing.write_text(
        f'#!/bin/sh\nwhile [ ! -s "{marker}" ]; do sleep 0.1; done\nexec env FAKE_VLLM_FAIL=1 "{wrapper}" "$@"\n'
    )
    failing.chmod(0o755)
    env["LONGHAUL_VLLM_PYTHON"] = str(failing)
    t0 = time.monotonic()
    rc = supervisor.launch(s["spec"], "local", s["run_dir"], environ=env)
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert rc == EXIT_FAILED, out
    assert "simulator server exited with code 3 before" in out and "simulated start-up failure" in out
    assert "restarting it" not in out  # a start failure is not a crash to restart
    assert "stage grpo: done" not in out and took < 100, (took, out)
    pid = int(marker.read_text())
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0  # the trainer was stopped


class _LateServer:
    """An HTTP server whose GET /v1/models answers 503 for `late_s` seconds, then 200."""

    def __init__(self, late_s: float) -> None:
        self.ready_at = time.monotonic() + late_s
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(inner):  # noqa: N802, N805
                self.requests += 1
                ok = inner.path == "/v1/models" and time.monotonic() >= self.ready_at
                body = json.dumps({"data": []} if ok else {"error": "loading"}).encode()
                inner.send_response(200 if ok else 503)
                inner.send_header("Content-Length", str(len(body)))
                inner.end_headers()
                inner.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_agent_loop_waits_until_the_simulator_serves_then_never_asks_again():
    server = _LateServer(1.5)
    try:
        asyncio.run(wait_until_serving(server.url, 30, interval_s=0.2))
        # returned only once the server serves (measured from when it turns ready, not from a clock read after
        # the server started: CI's loaded host once took 0.2 s between the two), after asking while it loaded
        assert time.monotonic() >= server.ready_at and server.requests >= 2
        asked = server.requests
        asyncio.run(wait_until_serving(server.url + "/", 30, interval_s=0.2))
        assert server.requests == asked  # seen serving: no second round
    finally:
        server.close()
        _SERVING.clear()


def test_the_wait_is_bounded_and_names_the_endpoint():
    url = f"http://user:secret@127.0.0.1:{free_port()}/v1"  # nothing listens there
    with pytest.raises(EndpointError) as err:
        asyncio.run(wait_until_serving(url, 0.6, interval_s=0.2))
    assert err.value.kind == FaultKind.CONNECTION_REFUSED and "did not serve within 0.6 s" in str(err.value)
    assert "secret" not in str(err.value)
    # no budget, no wait (outside a launch): returns at once, nothing asked
    asyncio.run(wait_until_serving(url, 0))


@pytest.mark.parametrize(
    ("raw", "expected"), [("600", 600.0), ("2.5", 2.5), ("", 0.0), ("nan", 0.0), ("inf", 0.0), ("-3", 0.0), ("x", 0.0)]
)
def test_the_wait_from_the_environment_is_finite_and_positive_or_none(raw, expected):
    assert wait_from_env({ENV_SERVER_WAIT_S: raw}) == expected


def test_the_agent_loop_module_waits_before_its_first_episode():
    """The agent loop calls the wait before it builds the episode's policy and user (source order: no trainer
    here to run it; the e2e pipelines run it for real)."""
    import inspect

    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop

    run = inspect.getsource(LonghaulAirlineAgentLoop.run)
    assert run.index("await self.await_simulator()") < run.index("VerlTokenPolicy(")
