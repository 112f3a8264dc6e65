"""Running Slurm's client commands (thin I/O): one place for the timeout, the missing-command hint and the
error text (sbatch's, scontrol's or sacct's own message becomes ours)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

CMD_TIMEOUT_S = 60


class SlurmError(RuntimeError):
    """A Slurm command failed or Slurm is not usable; the message says which command and why."""


Runner = Callable[..., subprocess.CompletedProcess[str]]


def run_slurm(
    argv: list[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    runner: Runner = subprocess.run,
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command with the timeout; SlurmError when it is missing, hangs or (with `check`) fails."""
    if shutil.which(argv[0]) is None:
        raise SlurmError(
            f"`{argv[0]}` not found on PATH: the slurm backend needs Slurm's client commands "
            "(Debian: apt-get install slurm-client; CI: scripts/ci/slurm-up.sh)"
        )
    try:
        proc = runner(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {CMD_TIMEOUT_S} s (is slurmctld up?)") from exc
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit code {proc.returncode}"
        raise SlurmError(f"`{' '.join(argv)}` failed: {msg}")
    return proc
