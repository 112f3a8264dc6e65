"""The rendered sbatch passes the job's GPU mask into an apptainer container only when Slurm set one: an unset
CUDA_VISIBLE_DEVICES (every GPU of the node) must not become an empty one (no GPU at all). The script's own
`CONTAINER=(...)` block is run by bash with and without the variable."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from longhaul.render.slurm import render_slurm
from support.specs import spec_variant


def _container_words(job_mask: str | None) -> list[str]:
    script = render_slurm(spec_variant("lata", backends__slurm__container={"runtime": "apptainer"}))
    (block,) = re.findall(r"^CONTAINER=\(.*?\)$", script, flags=re.M | re.S)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": "/submit", "LONGHAUL_IMAGE": "t.sif"}
    if job_mask is not None:
        env["CUDA_VISIBLE_DEVICES"] = job_mask
    out = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{block}\nprintf '%s\\n' \"${{CONTAINER[@]}}\""],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return out.splitlines()


@pytest.mark.parametrize("job_mask", ["2,3", "GPU-aaaa,GPU-bbbb"])
def test_a_set_mask_reaches_the_container_as_it_is(job_mask):
    words = _container_words(job_mask)
    i = words.index(f"CUDA_VISIBLE_DEVICES={job_mask}")
    assert words[i - 1] == "--env" and words[0] == "apptainer" and words[-1] == "t.sif"


def test_an_unset_mask_stays_unset_in_the_container():
    words = _container_words(None)
    assert not [w for w in words if w.startswith("CUDA_VISIBLE_DEVICES")], words
    assert words[0] == "apptainer" and words[-1] == "t.sif"
