"""A real `mlflow server` for tests: sqlite backend, local artifact root, a free loopback port, one worker.

Use the pytest fixture `mlflow_server` (session scope; import it into a conftest with
`from support.mlflow_server import mlflow_server  # noqa: F401`) or the context manager
`running_mlflow_server(root)` anywhere else. The server runs in its own session/process group and the whole
group is stopped in `finally` (a plain SIGTERM to MLflow's launcher leaves its workers orphaned).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.net import free_port

READY_TIMEOUT_S = float(os.environ.get("LONGHAUL_TEST_MLFLOW_TIMEOUT", "180"))


@dataclass
class MlflowServer:
    """A started server: `uri` is the tracking URI (http://127.0.0.1:PORT)."""

    uri: str
    port: int
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def db_path(self) -> Path:
        return self.root / "mlflow.db"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_mlflow_server(root: Path, *, timeout_s: float = READY_TIMEOUT_S, port: int | None = None) -> MlflowServer:
    """Start the server under `root` (db, artifacts, log) and wait for /health; raise with the log on failure.
    `port`: listen there (a server restarted on the same store and address, e.g. after `stop_mlflow_server`);
    default: a free one. The log is appended to, so a restarted server's log keeps the earlier run's."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port() if port is None else port
    log_path = root / "server.log"
    argv = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{(root / 'mlflow.db').absolute()}",
        "--artifacts-destination", str((root / "artifacts").absolute()),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    return _start(argv, port, root, log_path, cwd=None, timeout_s=timeout_s)


def start_printed_ui(command: str, cwd: Path, root: Path, *, timeout_s: float = READY_TIMEOUT_S) -> MlflowServer:
    """Run the `mlflow ui …` command a run printed (as a user pastes it) from `cwd`, on a free port, and wait
    for /health. `root` holds its log; the store is whatever the command names."""
    argv = shlex.split(command)
    if argv[:2] != ["mlflow", "ui"]:
        raise ValueError(f"not an `mlflow ui` command: {command!r}")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return _start(
        [sys.executable, "-m", *argv, "--port", str(port)], port, root, root / "ui.log", cwd=cwd, timeout_s=timeout_s
    )


def _start(
    argv: list[str], port: int, root: Path, log_path: Path, *, cwd: Path | None, timeout_s: float
) -> MlflowServer:
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "DO_NOT_TRACK": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    for client_var in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(client_var, None)  # the server must not inherit a client's settings
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=cwd)
    server = MlflowServer(f"http://127.0.0.1:{port}", port, root, proc, log_path)
    deadline = time.monotonic() + timeout_s
    try:
        while not _healthy(server.uri):
            if proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{server.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not healthy after {timeout_s:.0f}s:\n{server.log_tail()}")
            time.sleep(0.5)
    except BaseException:
        stop_mlflow_server(server)
        raise
    return server


def stop_mlflow_server(server: MlflowServer, grace_s: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `grace_s`."""
    pgid = server.process.pid  # start_new_session: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        server.process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # workers that ignored SIGTERM
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=5)


def restart_mlflow_server(server: MlflowServer, *, timeout_s: float = READY_TIMEOUT_S) -> MlflowServer:
    """The same store served again at the same address (stopping `server` first if it still runs)."""
    if server.process.poll() is None:
        stop_mlflow_server(server)
    deadline = time.monotonic() + 30
    while True:  # the old listener may take a moment to release the port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", server.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.2)
    return start_mlflow_server(server.root, timeout_s=timeout_s, port=server.port)


@contextlib.contextmanager
def running_mlflow_server(root: Path) -> Iterator[MlflowServer]:
    """Context manager around start/stop."""
    server = start_mlflow_server(root)
    try:
        yield server
    finally:
        stop_mlflow_server(server)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One real MLflow server for the test session."""
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server
