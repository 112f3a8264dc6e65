"""Fixtures for the tests against the real one-node Slurm (`scripts/ci/slurm-up.sh`, marker `slurm`).

They live in `support.slurm` (tests/support/slurm.py), shared with tests/reliability; this conftest makes the
fixtures visible here and re-exports the helpers the test modules import from `.conftest`."""

from __future__ import annotations

from support.slurm import (
    DROP,
    REPO,
    STUB_LAUNCHER,
    TERMINAL,
    cancel_quietly,
    job_info,
    longhaul,
    slurm_cluster,
    stub_venv,
    wait_job,
    write_spec,
)

__all__ = [
    "DROP",
    "REPO",
    "STUB_LAUNCHER",
    "TERMINAL",
    "cancel_quietly",
    "job_info",
    "longhaul",
    "slurm_cluster",
    "stub_venv",
    "wait_job",
    "write_spec",
]
