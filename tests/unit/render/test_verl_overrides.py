"""The veRL overrides of every shipped spec (GPU and CPU) compose and pass veRL 0.9.1's own config validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from longhaul.layout import Paths
from longhaul.render.verl import UNLIMITED_TOOL_CHARS, override_key, ray_job_env_overrides, render_verl_overrides
from longhaul.spec import load_spec
from longhaul.spec.models import Experiment

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))

pytestmark = pytest.mark.verl


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_overrides_compose_and_validate(path: Path) -> None:
    from support.verl_config import validate_verl

    exp = load_spec(path)
    paths = Paths.under("/runs/test")
    cfg = validate_verl(render_verl_overrides(exp, paths))
    s = exp.spec
    arr = cfg.actor_rollout_ref
    # The spec's values, not veRL's defaults, reached the composed config.
    assert arr.rollout.n == s.algorithm.group_size
    assert arr.rollout.multi_turn.max_tool_response_length == (s.environment.tool_output_limit or UNLIMITED_TOOL_CHARS)
    assert arr.rollout.multi_turn.max_assistant_turns == s.environment.max_turns
    assert arr.actor.loss_agg_mode == str(s.algorithm.loss_agg_mode)
    assert arr.actor.kl_loss_coef == s.algorithm.kl.coef
    assert arr.model.lora_rank == s.policy.lora.rank
    assert arr.rollout.agent.agent_loop_config_path == paths.config_dir + "/agent_loops.yaml"
    assert list(cfg.trainer.logger) == ["console", "mlflow"]
    assert cfg.trainer.default_local_dir == paths.checkpoint_dir
    assert cfg.data.max_response_length == s.environment.max_response_tokens
    assert cfg.algorithm.longhaul.alpha == s.algorithm.alpha
    expected = (
        "grpo"
        if (s.algorithm.advantage == "grpo" and s.reward.credit == "trajectory")
        else f"longhaul_{s.algorithm.advantage}"
    )
    assert cfg.algorithm.adv_estimator == expected
    # The trainer whose estimator receives per-token rewards (credit: turn) is pinned in the rendered list, not
    # left to veRL's default (which may change; on the v0 trainer turn credit silently became trajectory credit).
    overrides = render_verl_overrides(exp, paths)
    assert "trainer.use_v1=true" in overrides and "trainer.v1.trainer_mode=sync" in overrides
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "sync"
    cpu = s.resources.gpus_per_node == 0
    assert cfg.trainer.device == ("cpu" if cpu else "cuda")
    # One rollout engine and one FSDP version on every device: veRL's vLLM replica, FSDP2 actor and reference.
    assert arr.rollout.name == "vllm"
    assert {arr.actor.strategy, arr.ref.strategy, arr.actor.fsdp_config.strategy, arr.ref.fsdp_config.strategy} == {
        "fsdp2"
    }
    # The trainer computes in the spec's dtype: veRL's FSDP engine reads it from `mixed_precision` (bf16 when that is
    # unset, whatever `fsdp_config.dtype` says), as its engine config dataclass hands it to FSDP and the autocast.
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_dtypes import PrecisionType

    for role in (arr.actor, arr.ref):
        engine = omega_conf_to_dataclass(role.fsdp_config)
        assert PrecisionType.to_dtype(engine.mixed_precision["param_dtype"]) == getattr(torch, str(s.policy.dtype))
        assert PrecisionType.to_dtype(engine.mixed_precision["reduce_dtype"]) == torch.float32


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_spec_reaches_total_steps(path: Path) -> None:
    """veRL stops at the first of total_epochs × steps-per-epoch and total_training_steps; steps per epoch is
    len(train tasks) // train_batch_size (veRL's dataloader drops the last partial batch). Without a rendered
    total_epochs, veRL's default (30) ended specs/vanilla.yaml at step 300 of 500."""
    from longhaul.envs.airline.splits import build_split
    from support.verl_config import validate_verl

    exp = load_spec(path)
    cfg = validate_verl(render_verl_overrides(exp, Paths.under("/runs/test")))
    alg = exp.spec.algorithm
    steps_per_epoch = len(build_split(exp.spec.environment.split).train) // alg.train_batch_size
    assert steps_per_epoch >= 1
    assert cfg.trainer.total_training_steps == alg.total_steps
    assert cfg.trainer.total_epochs * steps_per_epoch >= alg.total_steps


def test_cpu_branch_runs_on_the_cpu_platform() -> None:
    """The smoke spec (gpus_per_node: 0) renders veRL's CPU platform: veRL's vLLM rollout in eager mode without
    sleep mode or chunked prefill, FSDP2 without compilation, one logical Ray GPU for the trainer rank; each key
    appears once (Hydra refuses two values for one key)."""
    overrides = render_verl_overrides(load_spec(ROOT / "specs" / "smoke.yaml"), Paths.under("/r"))
    for expected in (
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "+actor_rollout_ref.rollout.enable_sleep_mode=false",
        "actor_rollout_ref.rollout.enable_chunked_prefill=false",
        "+ray_kwargs.ray_init.num_gpus=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
    ):
        assert expected in overrides
    keys = [override_key(o) for o in overrides]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_cpu_multi_node_attaches_to_the_job_ray_cluster() -> None:
    """nodes: 2 on CPU: one trainer rank per node, and no Ray resources in `ray.init` (it attaches through
    RAY_ADDRESS to the cluster the job script started, where Ray refuses them); the composed config validates."""
    from support.verl_config import validate_verl

    doc = load_spec(ROOT / "specs" / "smoke.yaml").model_dump(mode="json", exclude_unset=True)
    doc["spec"]["resources"]["nodes"] = 2
    doc["spec"]["algorithm"]["ppo_micro_batch_size_per_gpu"] = 2
    overrides = render_verl_overrides(Experiment.model_validate(doc), Paths.under("/r"))
    assert "trainer.nnodes=2" in overrides and "trainer.n_gpus_per_node=1" in overrides
    assert not [o for o in overrides if o.startswith("+ray_kwargs.ray_init.")], overrides
    env = ray_job_env_overrides({"VERL_PLATFORM": "cpu", "MLFLOW_RUN_ID": "abc", "PATH": "/bin"}, {"PATH": "/bin"})
    cfg = validate_verl([*overrides, *env])
    assert dict(cfg.ray_kwargs.ray_init.runtime_env.env_vars) == {"MLFLOW_RUN_ID": "abc", "VERL_PLATFORM": "cpu"}


def test_ray_job_env_overrides_pass_only_what_the_launcher_added() -> None:
    env = ray_job_env_overrides(
        {"A": "1", "B": "it's $x", "SAME": "v", "bad-name": "x"},
        {"SAME": "v", "A": "0"},
    )
    assert env == [
        "+ray_kwargs.ray_init.runtime_env.env_vars.A='1'",
        "+ray_kwargs.ray_init.runtime_env.env_vars.B='it\\'s $x'",
    ]


def test_ray_job_env_overrides_never_carry_credentials() -> None:
    """A credential in an override would be printed with veRL's config and logged as an MLflow param."""
    env = ray_job_env_overrides(
        {
            "LONGHAUL_USER_SIM_API_KEY": "sk-1",
            "HF_TOKEN": "hf_x",
            "DB_PASSWORD": "p",
            "MLFLOW_TRACKING_URI": "http://u:s3cret@mlflow:5000",
            "SIM_URL": "http://sim:8001/v1?token=abc",
            "MLFLOW_RUN_ID": "r1",
        },
        {},
    )
    assert env == ["+ray_kwargs.ray_init.runtime_env.env_vars.MLFLOW_RUN_ID='r1'"]
    assert not any(secret in line for line in env for secret in ("sk-1", "hf_x", "s3cret", "abc"))


def test_registered_estimator_is_resolvable_by_verl() -> None:
    """The name the renderer emits is what `import verl` registered through our plugin entry point."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    exp = load_spec(ROOT / "specs" / "prm_lite_lata.yaml")
    name = next(
        o.split("=", 1)[1]
        for o in render_verl_overrides(exp, Paths.under("/r"))
        if o.startswith("algorithm.adv_estimator=")
    )
    assert callable(get_adv_estimator_fn(name))


def test_invalid_override_is_caught_by_verl() -> None:
    """The harness really validates: veRL rejects a loss_agg_mode it does not know."""
    from support.verl_config import validate_verl

    exp = load_spec(ROOT / "specs" / "lata.yaml")
    overrides = [
        o
        if not o.startswith("actor_rollout_ref.actor.loss_agg_mode=")
        else "actor_rollout_ref.actor.loss_agg_mode=seq-mean"
        for o in render_verl_overrides(exp, Paths.under("/r"))
    ]
    with pytest.raises(Exception, match="loss_agg_mode|seq-mean"):
        validate_verl(overrides)


def test_no_interpolation_reaches_verl_from_a_path() -> None:
    """Issue 30, class 5: every string value is escaped for Hydra and OmegaConf, so a run directory (or any path)
    that reads `${oc.env:…}` stays that text in veRL's composed, resolved config — no environment variable is
    pulled into paths, the printed config or MLflow params. (`--run-dir` refuses such a value before it gets here;
    this holds the renderer itself.)"""
    from omegaconf import OmegaConf

    from support.verl_config import compose_verl

    run_dir = "/runs/${oc.env:HOME}/a\\${x}/it's"
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    cfg = compose_verl(render_verl_overrides(exp, Paths.under(run_dir)))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["trainer"]["default_local_dir"] == run_dir + "/checkpoints"
    assert resolved["data"]["train_files"].startswith(run_dir + "/")
