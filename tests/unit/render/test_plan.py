"""The launch plan: servers, GPU placement, environment and stages rendered from the spec (pure)."""

from __future__ import annotations

from pathlib import Path

from longhaul.layout import default_run_dir
from longhaul.render.plan import render_plan, render_policy_server
from longhaul.spec import load_spec, run_name
from support.specs import spec_variant

ROOT = Path(__file__).resolve().parents[3]


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_gpu_plan_colocates_simulator_on_shared_gpus() -> None:
    exp = load_spec(ROOT / "specs" / "prm_lite_lata.yaml")
    plan = render_plan(exp, "kubernetes", "/runs/x")
    sim = plan.simulator
    assert sim is not None and plan.servers == (sim,)
    assert _flag(sim.argv, "--tensor-parallel-size") == "2"
    assert _flag(sim.argv, "--quantization") == "awq_marlin"
    assert _flag(sim.argv, "--gpu-memory-utilization") == "0.4"
    assert _flag(sim.argv, "--model") == "Qwen/Qwen2.5-72B-Instruct-AWQ"
    assert sim.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # CUDA graphs and vLLM's own process layout on GPUs: neither CPU-only setting
    assert "--enforce-eager" not in sim.argv and "VLLM_ENABLE_V1_MULTIPROCESSING" not in sim.env
    assert plan.simulator_base_url == "http://127.0.0.1:8001/v1"
    assert [s.name for s in plan.stages] == ["grpo", "eval"]
    grpo = plan.stages[0].argv
    assert grpo[:3] == ("python", "-m", "verl.trainer.main_ppo")
    assert "algorithm.adv_estimator=longhaul_lata" in grpo
    assert plan.env["HF_HUB_OFFLINE"] == "1" and plan.env["LONGHAUL_RUN_NAME"] == run_name(exp)


def test_dedicated_simulator_takes_the_last_gpus() -> None:
    exp = spec_variant("lata", resources__gpus_per_node=4, user_simulator__gpu_share="dedicated")
    plan = render_plan(exp, "slurm", "runs/x")
    assert plan.simulator.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "trainer.n_gpus_per_node=2" in plan.stages[0].argv


def test_external_simulator_starts_no_server() -> None:
    exp = spec_variant("lata", user_simulator__placement="external", user_simulator__url="http://sim.example:8001/v1")
    plan = render_plan(exp, "kubernetes", "/runs/x")
    assert plan.simulator is None and plan.servers == ()
    assert plan.simulator_base_url == "http://sim.example:8001/v1"


def test_cpu_smoke_plan_runs_verl_on_its_cpu_platform() -> None:
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    plan = render_plan(exp, "local", default_run_dir(exp, "local"), server_python="/opt/vllm/bin/python")
    sim, pol = plan.simulator, plan.policy_server
    for server in (sim, pol):
        assert server.argv[0] == "/opt/vllm/bin/python"
        assert "--tensor-parallel-size" not in server.argv and "--gpu-memory-utilization" not in server.argv
        assert "--kv-cache-memory-bytes=536870912" in server.argv and "CUDA_VISIBLE_DEVICES" not in server.env
        assert server.host == "127.0.0.1"
        # eager like veRL's CPU rollout, and the worker inside the engine-core process (one interpreter less)
        assert "--enforce-eager" in server.argv and server.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "--enable-auto-tool-choice" in pol.argv and "--enable-auto-tool-choice" not in sim.argv
    assert _flag(pol.argv, "--tool-call-parser") == "hermes"
    assert _flag(sim.argv, "--model") == ".cache/longhaul/models/tiny-user"
    assert plan.paths.run_dir == f"runs/{run_name(exp)}"
    grpo = plan.stages[0]
    assert grpo.argv[:3] == ("python", "-m", "verl.trainer.main_ppo")  # the same trainer as on GPUs
    assert grpo.env["VERL_PLATFORM"] == "cpu"
    assert "trainer.device=cpu" in grpo.argv and "actor_rollout_ref.rollout.name=vllm" in grpo.argv


def test_policy_server_can_serve_a_checkpoint() -> None:
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    server = render_policy_server(exp, "runs/x/checkpoints/global_step_2/hf")
    assert _flag(server.argv, "--model") == "runs/x/checkpoints/global_step_2/hf"
    assert _flag(server.argv, "--served-model-name") == exp.spec.policy.model.name


def test_sft_stage_makes_grpo_start_from_the_sft_model() -> None:
    exp = spec_variant("lata", stages=["sft", "grpo", "eval"], sft={})
    plan = render_plan(exp, "slurm", "/scratch/run")
    assert [s.name for s in plan.stages] == ["sft", "grpo", "eval"]
    assert "actor_rollout_ref.model.path='/scratch/run/sft/model'" in plan.stages[1].argv


def test_run_dirs_follow_backend_conventions() -> None:
    exp = load_spec(ROOT / "specs" / "lata.yaml")
    name = run_name(exp)
    assert default_run_dir(exp, "kubernetes") == f"/runs/{name}"
    assert default_run_dir(exp, "slurm") == f"runs/{name}"
    assert default_run_dir(exp, "local") == f"runs/{name}"
