"""A stand-in for `python -m vllm.entrypoints.openai.api_server` in launcher tests (started as the server python).

Accepts vLLM's argv (`-m MODULE --model DIR --served-model-name N --host H --port P ...`), serves `GET /health`,
`GET /v1/models` and the development endpoints the launcher uses for weight reloads (`POST /collective_rpc`,
`POST /reset_prefix_cache`). Every request and the argv are appended as JSON lines to $FAKE_VLLM_LOG.
$FAKE_VLLM_FAIL=1 makes it exit 3 at start; $FAKE_VLLM_DELAY delays readiness (seconds).
"""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _arg(argv: list[str], name: str, default: str | None = None) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else default


def _log(event: dict) -> None:
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"pid": os.getpid(), **event}) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    _log(
        {
            "event": "argv",
            "argv": argv,
            "env_dev_mode": os.environ.get("VLLM_SERVER_DEV_MODE"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    )
    print(f"fake vllm starting: {' '.join(argv)}", flush=True)
    if os.environ.get("FAKE_VLLM_FAIL") == "1":
        print("fake vllm: simulated start-up failure (no such model)", flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    model = _arg(argv, "--served-model-name", "model")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": model}]})
            else:
                self._send(404, {"error": self.path})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            _log({"event": "post", "path": self.path, "body": body})
            if self.path in ("/collective_rpc", "/reset_prefix_cache"):
                self._send(200, {"results": [None]})
            else:
                self._send(404, {"error": self.path})

    server = ThreadingHTTPServer((_arg(argv, "--host", "127.0.0.1"), int(_arg(argv, "--port", "8000"))), Handler)
    print("fake vllm: ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
