"""Child processes of the launcher: started in their own process group, logs prefixed, stopped by PID.

Each child gets a new session (`start_new_session=True`) so that a terminal's Ctrl-C reaches only the launcher,
which then stops the children deliberately and in order, and so that stopping a child also stops everything it
started (vLLM's engine core and workers) — the group is signalled, never a process name.

When the launcher itself dies without stopping them (SIGKILL, the OOM killer), its children must not run on: each
child is started with the kernel's parent-death signal (`PR_SET_PDEATHSIG` = SIGKILL, Linux), so the server or
trainer process dies with the launcher, and what those started and that outlives them (veRL's Ray head and
workers fate-share with the driver the same way; anything else) is found at the next start by the environment
variable every supervised process inherits (`ENV_SUPERVISED_BY=<run_dir>`) and killed (`kill_supervised`,
called by the launcher while it holds the run directory's lock, so no live launcher's children are touched).
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from longhaul.constants import ENV_SUPERVISED_BY, ENV_SUPERVISED_ROLE
from longhaul.protocol import STOP_GRACE_S

#: Lines of a child's output that mean a full disk (the launcher adds what to do to the failure message).
NO_SPACE_MARKERS = ("No space left on device", "[Errno 28]", "ENOSPC")
_PR_SET_PDEATHSIG = 1


def _libc_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def _die_with_parent(parent: int):
    """A `preexec_fn`: SIGKILL this child when the launcher (its parent) dies; if it already died, die now."""

    def set_pdeathsig() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return set_pdeathsig


def describe_exit(rc: int | None) -> str:
    """`exit code 3` / `killed by SIGKILL` for a Popen return code."""
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


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
        #: Whether the output ever said the disk is full (`NO_SPACE_MARKERS`), however long ago.
        self.no_space_seen = False
        self.log_error: OSError | None = None
        #: PIDs killed by `stop` that had left the child's process group (other sessions).
        self.swept: list[int] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> ManagedProcess:
        """Start the child (argv list, no shell) in a new session."""
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if ENV_SUPERVISED_BY in self.env:
            self.env[ENV_SUPERVISED_ROLE] = self.name
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # The kernel signals the child when the *thread* that started it ends: only the main thread's
                # children can be tied to the launcher's lifetime this way.
                preexec_fn=_die_with_parent(os.getpid())
                if threading.current_thread() is threading.main_thread()
                else None,
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
        """SIGTERM the group, SIGKILL it after `grace_s`, then SIGKILL what the child started in other sessions
        (when it is supervised: `ENV_SUPERVISED_BY`); returns the exit code (None if never started)."""
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
        if ENV_SUPERVISED_BY in self.env:
            self.swept = kill_supervised(self.env[ENV_SUPERVISED_BY], role=self.name, timeout_s=grace_s)
        if self._pump:
            self._pump.join(timeout=5)
        return self._proc.returncode

    # -- logs ------------------------------------------------------------------------------------------------

    def tail(self) -> str:
        """The last lines of output (for error messages)."""
        return "\n".join(self._tail)

    def _pump_logs(self) -> None:
        """Copy the child's output to its log, the tail and the console. The pipe is drained to the end whatever
        happens to the log file (a full disk must not block the child on a full pipe)."""
        assert self._proc is not None and self._proc.stdout is not None
        log = None
        if self.log_path:
            try:
                log = open(self.log_path, "ab")  # noqa: SIM115 - closed below
            except OSError as exc:
                self._log_failed(exc)
        prefix = f"[{self.name}] "
        try:
            for raw in iter(self._proc.stdout.readline, b""):
                if log:
                    try:
                        log.write(raw)
                        log.flush()
                    except OSError as exc:
                        self._log_failed(exc)
                        try:
                            log.close()
                        except OSError:
                            pass
                        log = None
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._tail.append(line)
                if not self.no_space_seen and any(m in line for m in NO_SPACE_MARKERS):
                    self.no_space_seen = True
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
                try:
                    log.close()
                except OSError as exc:
                    self._log_failed(exc)

    def _log_failed(self, exc: OSError) -> None:
        """The log file cannot be written (a full disk): keep the in-memory tail, say so once."""
        if self.log_error is None:
            self.log_error = exc
            if exc.errno == 28:
                self.no_space_seen = True
            line = f"(cannot write {self.log_path}: {exc}; the rest of this output is not logged)"
            self._tail.append(line)
            try:
                self.echo.write(f"[{self.name}] {line}\n")
                self.echo.flush()
            except (ValueError, OSError):
                pass


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


# -- leftovers of a launcher that was killed ---------------------------------------------------------------------


def _environ_has(pid: int, entries: list[bytes]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = set(fh.read().split(b"\0"))
    except OSError:  # gone, or not ours to read
        return False
    return all(e in env for e in entries)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def find_supervised(run_dir: str | Path, role: str | None = None) -> list[int]:
    """PIDs of live processes started by a launcher of `run_dir` (their environment has
    `ENV_SUPERVISED_BY=<run_dir>`, and `ENV_SUPERVISED_ROLE=<role>` when `role` is given), this process excluded.
    Linux (`/proc`); elsewhere none are found."""
    entries = [f"{ENV_SUPERVISED_BY}={Path(run_dir).absolute()}".encode()]
    if role is not None:
        entries.append(f"{ENV_SUPERVISED_ROLE}={role}".encode())
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    return sorted(p for p in pids if p != me and _environ_has(p, entries) and _alive(p))


def kill_supervised(run_dir: str | Path, role: str | None = None, timeout_s: float = 30.0) -> list[int]:
    """SIGKILL every live process of `find_supervised(run_dir, role)` and wait until they are gone; returns their
    PIDs. Without `role`, call it only while holding the run directory's lock (leftovers of a launcher that died,
    or the last sweep of the launcher's own)."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        pids = find_supervised(run_dir, role)
        if not pids or time.monotonic() >= deadline:
            return sorted(set(killed))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
