"""Servers take their GPUs by position inside the job's device mask (longhaul.render.gpus)."""

from __future__ import annotations

import pytest

from longhaul.render.gpus import GpuMaskError, within_job_mask


@pytest.mark.parametrize(
    ("positions", "mask", "devices"),
    [
        ("0,1", None, "0,1"),  # unset: the positions are the devices (Kubernetes, constrained Slurm)
        ("0,1", "2,3", "2,3"),  # a Slurm job given GPUs 2,3 on an unconstrained node
        ("2,3", "4,5,6,7", "6,7"),  # a dedicated simulator on the job's last two GPUs
        ("0", "7", "7"),
        ("1", " 3 , 5 ", "5"),
        ("0", "GPU-aaaa,GPU-bbbb", "GPU-aaaa"),  # UUIDs and MIG ids pass through
        ("1", "MIG-1/0/0,MIG-2/0/0", "MIG-2/0/0"),
    ],
)
def test_positions_index_into_the_job_mask(positions, mask, devices):
    assert within_job_mask(positions, mask) == devices


def test_an_empty_mask_hides_every_gpu_and_is_refused():
    with pytest.raises(GpuMaskError, match="set but empty"):
        within_job_mask("0", "")


def test_a_position_past_the_job_mask_names_both():
    with pytest.raises(GpuMaskError, match=r"GPU #2, but the job sees 2 \(CUDA_VISIBLE_DEVICES=4,5\)"):
        within_job_mask("1,2", "4,5")


def test_a_position_that_is_not_an_index_is_refused():
    with pytest.raises(GpuMaskError, match="not an index"):
        within_job_mask("a", "0,1")


@pytest.mark.parametrize("stem", ["lata", "prm_lite_lata", "qwen3_8b"])
def test_kubernetes_leaves_the_mask_to_the_device_plugin(stem):
    """A pod sees only its own GPUs, as 0..n-1: no manifest sets CUDA_VISIBLE_DEVICES, so the launcher's positions
    are the container's devices (an unset mask stays unset)."""
    import json

    from longhaul.render.kubernetes import render_job, render_rayjob
    from support.specs import spec_variant

    exp = spec_variant(stem)
    for stage in ("grpo", "eval"):
        for manifest in (render_job(exp, stage), render_rayjob(exp, stage)):
            assert "CUDA_VISIBLE_DEVICES" not in json.dumps(manifest)
            assert "nvidia.com/gpu" in json.dumps(manifest)  # the device plugin does hand the pod its GPUs
