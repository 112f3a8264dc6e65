"""Child processes of the launcher: started in their own process group, logs prefixed, stopped by PID.

Each child gets a new session (`start_new_session=True`) so that a terminal's Ctrl-C reaches only the launcher,
which then stops the children deliberately and in order, and so that stopping a child also stops everything it
started (vLLM's engine core and workers) — the group is signalled, never a process name.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from longhaul.launcher.protocol import STOP_GRACE_S


class ManagedProcess:
    """One child process with a prefixed, tee'd log and a bounded tail kept in memory for error messages."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: str | Path | None = None,
        cwd: str | Path | None = None,
        echo: TextIO | None = None,
        tail_lines: int = 40,
        console: Callable[[str], str | None] | None = None,
    ) -> None:
        if not argv:
            raise ValueError(f"{name}: empty command")
        self.name = name
        self.argv = [str(a) for a in argv]
        self.env = dict(env)
        self.log_path = Path(log_path) if log_path else None
        self.cwd = str(cwd) if cwd else None
        self.echo = echo if echo is not None else sys.stdout
        # What reaches the console: every line (None), or what `console(line)` returns (None = only logged).
        self.console = console
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> ManagedProcess:
        """Start the child (argv list, no shell) in a new session."""
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise RuntimeError(f"{self.name}: cannot start {self.argv[0]!r}: {exc}") from exc
        self._pump = threading.Thread(target=self._pump_logs, name=f"log-{self.name}", daemon=True)
        self._pump.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def poll(self) -> int | None:
        """Exit code, or None while running (also None before start)."""
        return self._proc.poll() if self._proc else None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code (raises subprocess.TimeoutExpired)."""
        assert self._proc is not None, "not started"
        rc = self._proc.wait(timeout=timeout)
        if self._pump:
            self._pump.join(timeout=5)
        return rc

    def send_signal(self, sig: int) -> None:
        """Signal the child's whole process group (it is the group leader), if it still runs."""
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the group, SIGKILL it after `grace_s`; returns the exit code (None if never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                self._proc.wait(timeout=grace_s)
        # Children of the group that outlived the leader (vLLM workers) get the same treatment.
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._pump:
            self._pump.join(timeout=5)
        return self._proc.returncode

    # -- logs ------------------------------------------------------------------------------------------------

    def tail(self) -> str:
        """The last lines of output (for error messages)."""
        return "\n".join(self._tail)

    def _pump_logs(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - closed below
        prefix = f"[{self.name}] "
        try:
            for raw in iter(self._proc.stdout.readline, b""):
                if log:
                    log.write(raw)
                    log.flush()
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._tail.append(line)
                shown = line if self.console is None else self.console(line)
                if shown is None:
                    continue
                try:
                    self.echo.write(prefix + shown + "\n")
                    self.echo.flush()
                except (ValueError, OSError):  # echo closed (interpreter shutting down)
                    pass
        finally:
            if log:
                log.close()


def wait_until(predicate, timeout_s: float, interval_s: float = 0.5, abort=None) -> bool:
    """Poll `predicate()` until true or `timeout_s`; `abort()` true stops early. Returns the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if abort is not None and abort():
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
