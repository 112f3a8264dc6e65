"""A scripted OpenAI-compatible chat server on 127.0.0.1 for tests and benchmarks.

Serves `POST /v1/chat/completions`, `GET /v1/models` and `GET /health`. Each request is answered by the script
registered for its `model` (a function `request_body -> reply`), where a reply is a full response dict or a
`Reply` (text and/or tool calls). Faults can be injected (`fail_next`: 5xx answers; `hang_next`: answers later
than the client's timeout) to test retries. Every request body is recorded in `server.requests`.

    with StubServer({"policy": my_policy_script, "user": my_user_script}) as srv:
        client = ChatClient(srv.base_url, "policy")

pytest: `from support.openai_stub import openai_stub` (fixture yielding a started server; register scripts with
`openai_stub.set_script(model, fn)`). As a process: `python tests/support/openai_stub.py --script airline-gold
--latency 0.05` prints the base URL on its first stdout line; `stub_process(...)` runs it so (benchmarks).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Reply:
    """A scripted assistant message. `tool_calls` items are (name, arguments) where arguments is a dict
    (serialised as JSON) or a raw string (sent as is, e.g. malformed JSON)."""

    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    status: int = 200  # a non-200 status answers with an error body instead (e.g. 400 context overflow)
    error: str = ""


Script = Callable[[dict[str, Any]], "Reply | dict[str, Any]"]


def render_reply(reply: Reply | dict[str, Any], model: str, counter: int) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body for a scripted reply."""
    if isinstance(reply, dict):
        return 200, reply
    if reply.status != 200:
        return reply.status, {"error": {"message": reply.error or "scripted error", "type": "BadRequestError", "code": reply.status}}
    calls = [
        {
            "id": f"chatcmpl-tool-{counter}-{i}",
            "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
        }
        for i, (name, args) in enumerate(reply.tool_calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if calls:
        message["tool_calls"] = calls
    completion = reply.completion_tokens
    if completion is None:
        completion = max(1, (len(reply.content) + sum(len(json.dumps(a)) for _, a in reply.tool_calls)) // 4)
    return 200, {
        "id": f"chatcmpl-{counter}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop")}],
        "usage": {
            "prompt_tokens": reply.prompt_tokens if reply.prompt_tokens is not None else 0,
            "completion_tokens": completion,
            "total_tokens": completion + (reply.prompt_tokens or 0),
        },
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms delayed-ACK stalls
    server: _HTTPServer

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        stub = self.server.stub
        if self.path.rstrip("/") in ("/health", "/v1/health"):
            self._send(200, {"status": "ok"})
        elif self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in stub.scripts]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        stub = self.server.stub
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        status, payload, delay = stub._answer(body)
        if delay:
            time.sleep(delay)
        self._send(status, payload)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    stub: StubServer


class StubServer:
    """The scripted server (a background thread; binds 127.0.0.1 only)."""

    def __init__(self, scripts: dict[str, Script] | None = None, *, latency_s: float = 0.0, port: int = 0) -> None:
        self.scripts: dict[str, Script] = dict(scripts or {})
        self.latency_s = latency_s
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._faults: list[tuple[str, float]] = []  # ("fail", status) | ("hang", seconds)
        self._counter = 0
        self._httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.stub = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def set_script(self, model: str, script: Script) -> None:
        self.scripts[model] = script

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next `n` chat requests with HTTP `status`."""
        with self._lock:
            self._faults.extend([("fail", float(status))] * n)

    def hang_next(self, n: int, seconds: float) -> None:
        """Delay the next `n` chat requests by `seconds` (longer than the client timeout → timeouts)."""
        with self._lock:
            self._faults.extend([("hang", seconds)] * n)

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        with self._lock:
            self.requests.append(body)
            self._counter += 1
            counter = self._counter
            fault = self._faults.pop(0) if self._faults else None
        if fault and fault[0] == "fail":
            return int(fault[1]), {"error": {"message": "injected server error"}}, self.latency_s
        delay = self.latency_s + (fault[1] if fault else 0.0)
        model = str(body.get("model", ""))
        script = self.scripts.get(model)
        if script is None:
            return 404, {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}, delay
        try:
            reply = script(body)
        except Exception as exc:  # a broken script is a test bug: answer 500 with the reason
            return 500, {"error": {"message": f"script error: {type(exc).__name__}: {exc}"}}, delay
        status, payload = render_reply(reply, model, counter)
        return status, payload, delay

    def start(self) -> StubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="openai-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def openai_stub() -> Iterator[StubServer]:
    """A started `StubServer` with no scripts (add them with `set_script`)."""
    with StubServer() as srv:
        yield srv


@contextlib.contextmanager
def stub_process(script: str = "airline-gold", latency_s: float = 0.0) -> Iterator[str]:
    """This module's server in a separate process (benchmarks: its CPU does not count against the client);
    yields its base URL and stops it on exit."""
    import subprocess
    import sys

    tests_dir = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, __file__, "--script", script, "--latency", str(latency_s)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=tests_dir))
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _main() -> None:
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible server on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    parser.add_argument("--script", default="airline-gold", choices=["airline-gold", "airline-flaky"])
    args = parser.parse_args()
    from support.airline_scripts import airline_scripts

    srv = StubServer(airline_scripts(args.script), latency_s=args.latency, port=args.port).start()
    print(srv.base_url, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: (srv.stop(), sys.exit(0)))
    try:
        signal.pause()
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _main()
