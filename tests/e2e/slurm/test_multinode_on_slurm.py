"""The CI cluster's two-node partition `multi` (two more slurmd daemons on this host, `scripts/ci/slurm-up.sh`),
which the two-node training job of tests/e2e/slurm/test_smoke_on_slurm.py runs on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import TERMINAL, wait_job

pytestmark = [pytest.mark.slurm]


def test_multi_partition_runs_one_task_on_each_node(slurm_cluster, tmp_path):
    """Partition `multi` places one task on each of its two nodes."""
    out = tmp_path / "hosts.out"
    job = subprocess.run(
        ["sbatch", "--parsable", "-p", "multi", "-N", "2", "--ntasks-per-node=1", "-t", "1", "-o", str(out)]
        + ["--wrap", "srun printenv SLURMD_NODENAME"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    info = wait_job(job, lambda i: i.get("JobState") in TERMINAL, 120, "a terminal state")
    assert info["JobState"] == "COMPLETED", info
    assert sorted(Path(out).read_text().split()) == ["lh-node1", "lh-node2"]
