"""A scripted OpenAI-compatible chat server on 127.0.0.1 for tests and benchmarks.

Serves `POST /v1/chat/completions`, `GET /v1/models` and `GET /health`. Each request is answered by the script
registered for its `model` (a function `request_body -> reply`), where a reply is a full response dict or a
`Reply` (text and/or tool calls). Every request body is recorded in `server.requests`.

Faults: `inject(fault, n, model=..., after=...)` answers the next `n` requests (of `model`, after letting `after`
of them through) with one of `FAULTS` — HTTP errors, answers slower than the client's timeout, truncated, malformed
or non-UTF-8 bodies, chat completions with empty `choices`, a null message, broken `tool_calls`, no text, tool calls
with invalid JSON arguments, a connection closed or reset without an answer, or the port closed for a while
(connection refused). `fail_next` (5xx) and `hang_next` (timeouts) are the older shorthands. `server.injected`
counts the faults delivered per kind.

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
import socket
import struct
import threading
import time
from collections import Counter
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

#: Fault kinds `StubServer.inject` knows, and what the client sees.
FAULTS = {
    "status": "an HTTP error status (`status=`, default 503) with a JSON error body",
    "hang": "the answer `seconds` late (longer than the client's timeout: a timeout)",
    "truncated_body": "Content-Length promises the whole completion, half of it is sent, then the connection closes",
    "truncated_json": "HTTP 200 with the first half of the completion's JSON (Content-Length matches)",
    "malformed_json": "HTTP 200 with a body that is not JSON (single quotes, trailing garbage)",
    "non_utf8": "HTTP 200 with a Latin-1 encoded body (a byte that is not UTF-8 in the content)",
    "empty_body": "HTTP 200 with an empty body",
    "empty_choices": "a chat completion with `choices: []`",
    "null_message": "a chat completion whose `choices[0].message` is null",
    "bad_tool_calls": "a chat completion whose `tool_calls` is a string, not a list",
    "empty_content": "a chat completion with no text and no tool calls",
    "invalid_tool_args": "a tool call whose `arguments` is not valid JSON (the policy's output, not a transport fault)",
    "close": "the connection closed without an answer",
    "reset": "the connection reset (RST) without an answer",
    "refuse": "the connection closed and the port closed for `seconds` (connection refused meanwhile)",
}


@dataclass
class _Injection:
    fault: str
    remaining: int
    model: str | None
    after: int
    status: int = 503
    seconds: float = 0.0


@dataclass(frozen=True)
class RawAnswer:
    """A fault the handler writes itself (not a JSON body): `action` is bytes | close | reset | refuse."""

    action: str
    status: int = 200
    body: bytes = b""
    declared_length: int | None = None
    seconds: float = 0.0


def render_reply(reply: Reply | dict[str, Any], model: str, counter: int) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body for a scripted reply."""
    if isinstance(reply, dict):
        return 200, reply
    if reply.status != 200:
        return reply.status, {
            "error": {"message": reply.error or "scripted error", "type": "BadRequestError", "code": reply.status}
        }
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
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens if reply.prompt_tokens is not None else 0,
            "completion_tokens": completion,
            "total_tokens": completion + (reply.prompt_tokens or 0),
        },
    }


def _corrupt(kind: str, payload: dict[str, Any]) -> dict[str, Any] | RawAnswer:
    """A scripted completion turned into the fault `kind` (see `FAULTS`)."""
    data = json.dumps(payload).encode()
    if kind == "truncated_body":
        return RawAnswer("bytes", body=data[: len(data) // 2], declared_length=len(data))
    if kind == "truncated_json":
        return RawAnswer("bytes", body=data[: len(data) // 2])
    if kind == "non_utf8":
        msg = dict(payload["choices"][0]["message"], content="Caf\u00e9 ok")
        body = json.dumps({**payload, "choices": [{**payload["choices"][0], "message": msg}]}, ensure_ascii=False)
        return RawAnswer("bytes", body=body.encode("latin-1", errors="replace"))
    choice = payload["choices"][0]
    if kind == "empty_choices":
        return {**payload, "choices": []}
    if kind == "null_message":
        return {**payload, "choices": [{**choice, "message": None}]}
    if kind == "bad_tool_calls":
        return {
            **payload,
            "choices": [
                {
                    **choice,
                    "message": {"role": "assistant", "content": None, "tool_calls": "get_user_details(user_id=1)"},
                }
            ],
        }
    if kind == "empty_content":
        return {
            **payload,
            "choices": [{**choice, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}],
        }
    if kind == "invalid_tool_args":
        calls = choice["message"].get("tool_calls") or []
        name = calls[0]["function"]["name"] if calls else "get_user_details"
        bad = {
            "id": f"{payload['id']}-bad",
            "type": "function",
            "function": {"name": name, "arguments": '{"user_id": '},
        }
        return {
            **payload,
            "choices": [
                {
                    **choice,
                    "message": {"role": "assistant", "content": None, "tool_calls": [bad]},
                    "finish_reason": "tool_calls",
                }
            ],
        }
    raise ValueError(f"not a body fault: {kind}")


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
        if isinstance(payload, RawAnswer):
            self._send_raw(payload)
        else:
            self._send(status, payload)

    def _send_raw(self, raw: RawAnswer) -> None:
        if raw.action == "bytes":
            self.send_response(raw.status)
            self.send_header("Content-Type", "application/json")
            self.send_header(
                "Content-Length", str(raw.declared_length if raw.declared_length is not None else len(raw.body))
            )
            self.end_headers()
            self.wfile.write(raw.body)
            if raw.declared_length is not None and raw.declared_length > len(raw.body):
                self.wfile.flush()
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.close_connection = True
        if raw.action == "refuse":
            self.server.stub._refuse(raw.seconds)
        if raw.action == "reset":
            # SO_LINGER 0: close() sends RST instead of FIN
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024
    stub: StubServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client gave up first (a `hang` fault past its timeout) or the fault closed the socket
        super().handle_error(request, client_address)


class StubServer:
    """The scripted server (a background thread; binds 127.0.0.1 only)."""

    def __init__(self, scripts: dict[str, Script] | None = None, *, latency_s: float = 0.0, port: int = 0) -> None:
        self.scripts: dict[str, Script] = dict(scripts or {})
        self.latency_s = latency_s
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._faults: list[_Injection] = []
        self.injected: Counter[str] = Counter()
        self._counter = 0
        self._httpd = _HTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.stub = self
        self._thread: threading.Thread | None = None
        self._port = self._httpd.server_address[1]
        self._reopen: threading.Timer | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def set_script(self, model: str, script: Script) -> None:
        self.scripts[model] = script

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next `n` chat requests with HTTP `status`."""
        self.inject("status", n, status=status)

    def hang_next(self, n: int, seconds: float) -> None:
        """Delay the next `n` chat requests by `seconds` (longer than the client timeout → timeouts)."""
        self.inject("hang", n, seconds=seconds)

    def inject(
        self,
        fault: str,
        n: int = 1,
        *,
        model: str | None = None,
        after: int = 0,
        status: int = 503,
        seconds: float = 1.0,
    ) -> None:
        """Answer `n` chat requests (of `model`, or any) with `fault` (one of `FAULTS`), after letting the next
        `after` of them through. Injections queue up: the first pending one whose model matches applies."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; valid: {', '.join(FAULTS)}")
        with self._lock:
            self._faults.append(_Injection(fault, n, model, after, status, seconds))

    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def clear_faults(self) -> None:
        """Drop the injections not delivered yet."""
        with self._lock:
            self._faults.clear()

    def _take_fault(self, model: str) -> _Injection | None:
        for f in self._faults:
            if f.model is not None and f.model != model:
                continue
            if f.after > 0:
                f.after -= 1
                return None
            f.remaining -= 1
            if f.remaining <= 0:
                self._faults.remove(f)
            self.injected[f.fault] += 1
            return f
        return None

    def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | RawAnswer, float]:
        model = str(body.get("model", ""))
        with self._lock:
            self.requests.append(body)
            self._counter += 1
            counter = self._counter
            fault = self._take_fault(model)
        kind = fault.fault if fault else None
        if kind == "status":
            return fault.status, {"error": {"message": "injected server error"}}, self.latency_s
        if kind in ("close", "reset", "refuse"):
            return 200, RawAnswer(kind, seconds=fault.seconds), self.latency_s
        if kind == "empty_body":
            return 200, RawAnswer("bytes", body=b""), self.latency_s
        if kind == "malformed_json":
            return (
                200,
                RawAnswer("bytes", body=b"{'choices': [{'message': {'content': 'hi'}}]} trailing"),
                self.latency_s,
            )
        delay = self.latency_s + (fault.seconds if kind == "hang" else 0.0)
        script = self.scripts.get(model)
        if script is None:
            return 404, {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}, delay
        try:
            reply = script(body)
        except Exception as exc:  # a broken script is a test bug: answer 500 with the reason
            return 500, {"error": {"message": f"script error: {type(exc).__name__}: {exc}"}}, delay
        status, payload = render_reply(reply, model, counter)
        if kind is None or kind == "hang" or status != 200:
            return status, payload, delay
        return 200, _corrupt(kind, payload), delay

    def _refuse(self, seconds: float) -> None:
        """Close the listening socket now (connections are refused) and listen on the same port again after
        `seconds`. Called from a handler thread."""
        old = self._httpd
        threading.Thread(target=lambda: (old.shutdown(), old.server_close()), daemon=True).start()

        def reopen() -> None:
            deadline = time.monotonic() + 5
            while True:
                try:
                    httpd = _HTTPServer(("127.0.0.1", self._port), _Handler)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            httpd.stub = self
            self._httpd = httpd
            self._thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="openai-stub", daemon=True)
            self._thread.start()

        self._reopen = threading.Timer(seconds, reopen)
        self._reopen.daemon = True
        self._reopen.start()

    def start(self) -> StubServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="openai-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._reopen is not None:
            self._reopen.join(timeout=10)  # a `refuse` fault in progress: stop the server it brings back
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
    proc = subprocess.Popen(
        [sys.executable, __file__, "--script", script, "--latency", str(latency_s)],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=tests_dir),
    )
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
