"""Stop/checkpoint requests raised by signals and read by stages (in-process stages poll `StopControl`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from longhaul.protocol import CHECKPOINT_SIGNAL, EXIT_KILLED, EXIT_SIGINT


class StopRequested(Exception):  # noqa: N818 - a control-flow signal, not an error
    """SIGTERM / Ctrl-C: stop cleanly without saving anything new."""


class RequeueRequested(Exception):  # noqa: N818
    """SIGUSR1 was handled: a checkpoint is saved (or the newest periodic one stands); exit EXIT_REQUEUE."""


@dataclass
class StopControl:
    """What the signal handlers asked for. Thread-safe; stages call `check()` at safe points."""

    checkpoint: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    signal_name: str | None = None

    @property
    def requested(self) -> bool:
        return self.checkpoint.is_set() or self.stop.is_set()

    @property
    def stop_exit_code(self) -> int:
        return EXIT_SIGINT if self.signal_name == "SIGINT" else EXIT_KILLED

    def check(self) -> None:
        """Raise StopRequested when a stop was asked for (a checkpoint request is handled by the caller)."""
        if self.stop.is_set():
            raise StopRequested(self.signal_name or "stop")

    def request_stop(self, name: str) -> None:
        self.signal_name = self.signal_name or name
        self.stop.set()

    def request_checkpoint(self) -> None:
        self.checkpoint.set()


@contextmanager
def handle_signals(control: StopControl) -> Iterator[StopControl]:
    """Install SIGUSR1/SIGTERM/SIGINT handlers that set `control` (main thread only); restore them after.

    A second Ctrl-C raises KeyboardInterrupt at once (the caller's `finally` still stops the servers).
    """
    if threading.current_thread() is not threading.main_thread():
        yield control
        return

    def on_term(signum, _frame):
        name = signal.Signals(signum).name
        if name == "SIGINT" and control.stop.is_set():
            raise KeyboardInterrupt
        control.request_stop(name)

    def on_usr1(_signum, _frame):
        control.request_checkpoint()

    previous = {
        sig: signal.signal(sig, handler)
        for sig, handler in ((signal.SIGTERM, on_term), (signal.SIGINT, on_term), (CHECKPOINT_SIGNAL, on_usr1))
    }
    try:
        yield control
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
