"""Fixtures and helpers for tests against the real one-node Slurm (`scripts/ci/slurm-up.sh`, marker `slurm`).

Shared by tests/e2e/slurm (whose conftest re-exports everything here) and tests/reliability; a test module
outside tests/e2e/slurm imports the fixtures it uses (`slurm_cluster`, `stub_venv`) from here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from longhaul.spec import load_spec
from longhaul.submit.slurm import parse_scontrol

REPO = Path(__file__).resolve().parents[2]
#: The protocol stub that stands in for `longhaul launch` (see its docstring).
STUB_LAUNCHER = REPO / "tests" / "e2e" / "slurm" / "stub_launcher.py"
TERMINAL = {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}


def sbatch_directives(script: str) -> dict[str, str | None]:
    """`{option: value}` of a script's `#SBATCH --option[=value]` lines (None for a bare flag)."""
    out: dict[str, str | None] = {}
    for line in script.splitlines():
        m = re.match(r"#SBATCH --([a-z-]+)(?:=(.*))?$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def fake_venv(root: Path, launcher: str) -> Path:
    """`<root>/venv` whose `bin/activate` puts it on PATH and whose `bin/longhaul` runs the Python text `launcher`."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    (venv / "bin" / "longhaul").write_text(f"#!{sys.executable}\n{launcher}")
    (venv / "bin" / "longhaul").chmod(0o755)
    return venv


def _cluster_up() -> bool:
    if shutil.which("scontrol") is None:
        return False
    proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    return "is UP" in proc.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The real cluster; started with scripts/ci/slurm-up.sh (idempotent) when we may, else the test fails."""
    if not _cluster_up():
        if os.geteuid() != 0:
            pytest.fail(
                "no Slurm cluster answers `scontrol ping` and starting one needs root: run "
                "scripts/ci/slurm-up.sh as root first"
            )
        subprocess.run([str(REPO / "scripts/ci/slurm-up.sh")], check=True, timeout=900)
    assert _cluster_up()


def job_info(job_id: str) -> dict[str, str]:
    """The job's scontrol record; {} when Slurm does not answer (a starved slurmctld: the caller keeps polling)."""
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {}
    return parse_scontrol(proc.stdout) if proc.returncode == 0 else {}


def wait_job(
    job_id: str,
    pred: Callable[[dict[str, str]], bool],
    timeout: float,
    what: str,
    on_poll: Callable[[dict[str, str]], None] | None = None,
) -> dict[str, str]:
    """Poll `scontrol show job` every 0.2 s (sbatch --wait polls at 2, 10, 42 s) until `pred` holds."""
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = job_info(job_id)
        if on_poll:
            on_poll(info)
        if info and pred(info):
            return info
        time.sleep(0.2)
    raise AssertionError(f"job {job_id}: {what} not reached within {timeout:.0f} s; last: {info}")


def cancel_quietly(job_id: str | None) -> None:
    """Clean-up only: never raises (the test's own assertion or error is what matters)."""
    if job_id:
        try:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def stub_venv(tmp_path: Path) -> Path:
    """A virtualenv-shaped directory whose `longhaul` is the protocol stub (tests/e2e/slurm/stub_launcher.py)."""
    venv = tmp_path / "stubvenv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n', encoding="utf-8")
    launcher = venv / "bin" / "longhaul"
    launcher.write_text(f'#!/bin/sh\nexec {sys.executable} {STUB_LAUNCHER} "$@"\n', encoding="utf-8")
    launcher.chmod(0o755)
    return venv


#: A `write_spec` change value that removes the key (e.g. `spec__algorithm__seed=DROP` to set `seeds`).
DROP = object()


def write_spec(base: str, dest: Path, *, name: str, **changes: object) -> Path:
    """specs/<base>.yaml with dotted-path `changes` (e.g. spec__resources__time_limit) written to `dest`."""
    doc = yaml.safe_load((REPO / "specs" / f"{base}.yaml").read_text(encoding="utf-8"))
    doc["metadata"]["name"] = name
    for dotted, value in changes.items():
        node = doc
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is DROP:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = value
    dest.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    load_spec(dest)  # the test spec itself must be valid
    return dest


def longhaul(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (`python -m longhaul.cli`) in `cwd`."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
