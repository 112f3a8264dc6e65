"""A server started by the launcher takes its GPUs inside the job's own device mask: the plan's positions 0,1
become the job's 2,3; an unset mask stays unset (the positions are the devices); an empty one is refused before
anything starts. Through the launcher's real server start, with the fake vLLM recording its environment."""

from __future__ import annotations

import json
import os

import pytest

from longhaul.launcher.servers import ManagedServer, ServerStartError
from longhaul.render.plan import render_plan
from support.net import free_port
from support.specs import spec_variant


def _simulator(setup, job_mask: str | None) -> str | None:
    """Start the GPU spec's simulator under a job with `job_mask`; returns the CUDA_VISIBLE_DEVICES it got."""
    exp = spec_variant("lata", user_simulator__port=free_port(), backends__local={"policy_port": free_port()})
    plan = render_plan(exp, "local", str(setup["run_dir"]), server_python=setup["env"]["LONGHAUL_VLLM_PYTHON"])
    assert plan.simulator.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # positions: the job's first two GPUs
    env = {k: v for k, v in setup["env"].items() if k != "CUDA_VISIBLE_DEVICES"}
    if job_mask is not None:
        env["CUDA_VISIBLE_DEVICES"] = job_mask
    server = ManagedServer(plan.simulator, env, setup["tmp"] / "logs")
    try:
        server.start()
        server.wait_healthy()
    finally:
        server.stop()
    (record,) = [json.loads(line) for line in setup["log"].read_text().splitlines() if '"argv"' in line]
    return record["cuda_visible_devices"]


@pytest.mark.parametrize(("job_mask", "devices"), [("2,3", "2,3"), ("5,6,7", "5,6"), (None, "0,1")])
def test_the_simulator_gets_its_gpus_inside_the_job_mask(setup, job_mask, devices):
    assert _simulator(setup, job_mask) == devices


def test_an_empty_job_mask_is_refused_before_the_server_starts(setup):
    with pytest.raises(ServerStartError, match="simulator server: the job's CUDA_VISIBLE_DEVICES is set but empty"):
        _simulator(setup, "")
    assert not os.path.exists(setup["log"])  # nothing was started


def test_a_job_with_too_few_gpus_is_refused(setup):
    with pytest.raises(ServerStartError, match=r"needs the job's GPU #1, but the job sees 1"):
        _simulator(setup, "3")
