"""Gloo ranks for the tests that run veRL's FSDP2 code on CPU: a script started once per rank, here.

Each rank is a fresh interpreter started by the test itself, with no launcher process in between (one that
imported torch and transformers only to spawn the ranks cost seconds of the CPU that the ranks and CI's other
worker need). The ranks meet at a TCP rendezvous on a free loopback port: `script RANK PORT *args`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.net import free_port


def run_ranks(
    script: Path, args: Sequence[str], *, world: int, env: Mapping[str, str], logs: Path, timeout: float
) -> None:
    """Run `python script RANK PORT *args` for every rank at once and wait for all; their output goes to
    `logs/rank<R>.log`. Fails with the log of a rank that exits non-zero, or after `timeout` seconds;
    the others are then stopped (a rank whose peer died would wait in its next collective)."""
    port = free_port()
    procs = []
    for rank in range(world):
        with (logs / f"rank{rank}.log").open("wb") as log:
            argv = [sys.executable, str(script), str(rank), str(port), *args]
            procs.append(subprocess.Popen(argv, env=dict(env), stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if all(code is not None for code in codes) or any(codes):  # all done, or one failed
                break
            time.sleep(0.2)
    finally:
        running = [rank for rank, p in enumerate(procs) if p.poll() is None]
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    failed = next((rank for rank, p in enumerate(procs) if p.returncode and rank not in running), None)
    if failed is not None:
        tail = (logs / f"rank{failed}.log").read_text(errors="replace")[-4000:]
        raise AssertionError(f"rank {failed} exited with {procs[failed].returncode}:\n{tail}")
    assert not running, f"ranks {running} still running after {timeout:.0f} s"
