"""Loopback networking for tests: a free port, and waiting until a server we started answers HTTP."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago (also: a port that refuses connections)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(
    url: str,
    timeout: float = 60.0,
    *,
    proc: subprocess.Popen[Any] | None = None,
    log: Path | None = None,
    interval: float = 0.2,
) -> None:
    """Return once GET `url` answers with a status below 500; RuntimeError when `proc` exits first or after
    `timeout` seconds, with the tail of `log` when given."""
    import httpx

    def tail() -> str:
        return ":\n" + log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise RuntimeError(f"{url} not up after {timeout}s{tail()}")
