"""Spec → Hydra override list for `python -m verl.trainer.main_ppo` (veRL 0.9.1), pure.

Every knob comes from the spec; nothing here has a default of its own except veRL plumbing that is fixed by
design (server-mode vLLM rollout, hermes tool format, mlflow logger, our agent loop). The list is composed
against veRL's real Hydra config and `validate_config` in the tests.
"""

from __future__ import annotations

import re

from longhaul.agentloop.config import AGENT_LOOP_NAME, sampler_overrides
from longhaul.algos import render_algorithm_overrides
from longhaul.chat.thinking import chat_template_kwargs, chat_template_override
from longhaul.layout import Paths
from longhaul.redact import redact_value
from longhaul.spec.models import Experiment, Stage
from longhaul.spec.naming import experiment_family, run_name
from longhaul.spec.placement import trainer_gpu_ids
from longhaul.spec.trainer_mode import ImportanceSampling, TrainerMode, parameter_sync_step
from longhaul.verlcpu import vllm_cpu_engine_args

#: veRL's tool-response limit has no "unlimited"; this many characters means "never truncate" in practice.
UNLIMITED_TOOL_CHARS = 10_000_000
#: Logical Ray CPU slots on the CPU platform: scheduling slots for veRL's actors (TaskRunner, trainer rank,
#: agent-loop worker, reward loop, TransferQueue controller and storage), not cores.
CPU_RAY_SLOTS = 8
#: veRL's own per-step generation dump (decoded text and score per sample), under the run's logs directory
#: (the rollouts directory holds longhaul's trajectory traces, which `longhaul explain` reads).
VERL_ROLLOUT_DUMP_SUBDIR = "verl_generations"


def _b(v: bool) -> str:
    return "true" if v else "false"


def hydra_quote(s: str) -> str:
    """Quote a string value for Hydra's override grammar: single quotes, a quote escaped with a backslash, and
    backslashes doubled only where Hydra reads them as escapes (before a quote, at the end); Hydra keeps every
    other backslash as it is (a chat template's `'\\n'` must reach veRL unchanged). An interpolation's `${` is
    escaped (`\\${`, its backslashes doubled) so that OmegaConf keeps it as text: a run directory named
    `${oc.env:HOME}` must not resolve an environment variable into paths, veRL's printed config or MLflow."""
    s = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", s)
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", s)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return "'" + body + "'"


_q = hydra_quote


def policy_model_path(exp: Experiment, paths: Paths) -> str:
    """Initial policy for GRPO: the SFT stage's output when the spec warm-starts, else the baked model."""
    if Stage.SFT in exp.spec.stages:
        return paths.sft.model
    return exp.spec.policy.model.path or exp.spec.policy.model.name


def render_verl_overrides(exp: Experiment, paths: Paths) -> list[str]:
    """The complete override list for veRL's `ppo_trainer` config (GPU, or veRL's CPU platform when
    `resources.gpus_per_node` is 0: same trainer, agent loop and estimators; see `render_cpu_overrides`)."""
    s = exp.spec
    cpu = s.resources.gpus_per_node == 0
    out = [
        *_data_overrides(exp, paths),
        *_model_overrides(exp, paths),
        *_actor_overrides(exp),
        *_rollout_overrides(exp, paths),
        *_trainer_overrides(exp, paths),
    ]
    if s.resources.nodes == 1:
        # One node: veRL's driver starts its own Ray. Without an address, `ray.init` would attach to whatever
        # cluster the host's /tmp/ray/ray_current_cluster names: another job's, or one that died without
        # `ray stop` (seen here: every local run failed while a finished multi-node test's file was left).
        out.append("+ray_kwargs.ray_init.address=local")
    out += render_chat_overrides(exp)
    if cpu:
        out = merge_overrides(out, render_cpu_overrides(exp))
    # The estimator name and its `algorithm.longhaul.*` settings come from the algos package (one definition).
    # A failed trajectory drops its whole group, which is refilled (longhaul.agentloop.sampler).
    out += sampler_overrides(exp)
    return [*out, "algorithm.use_kl_in_reward=false", *render_algorithm_overrides(exp)]


#: The prefix of the actor, reference and rollout keys in veRL's `ppo_trainer` config.
_A = "actor_rollout_ref"


def _data_overrides(exp: Experiment, paths: Paths) -> list[str]:
    """data: one row per training task; the agent loop builds the real prompt (policy text, tools, first user turn)."""
    env, alg = exp.spec.environment, exp.spec.algorithm
    return [
        f"data.train_files={_q(paths.data_file('train'))}",
        f"data.val_files={_q(paths.data_file('val'))}",
        f"data.train_batch_size={alg.train_batch_size}",
        f"data.max_prompt_length={env.max_prompt_tokens}",
        f"data.max_response_length={env.max_response_tokens}",
        "data.return_raw_chat=true",
        f"data.seed={alg.seed}",
    ]


def _model_overrides(exp: Experiment, paths: Paths) -> list[str]:
    """The policy model: its path, LoRA adapters and kernels."""
    pol = exp.spec.policy
    a = _A
    return [
        f"{a}.model.path={_q(policy_model_path(exp, paths))}",
        f"{a}.model.lora_rank={pol.lora.rank}",
        f"{a}.model.lora_alpha={pol.lora.alpha}",
        f"{a}.model.target_modules="
        + (
            pol.lora.target_modules
            if isinstance(pol.lora.target_modules, str)
            else "[" + ",".join(_q(m) for m in pol.lora.target_modules) + "]"
        ),
        f"{a}.model.enable_gradient_checkpointing={_b(pol.gradient_checkpointing)}",
        f"{a}.model.use_fused_kernels={_b(pol.use_fused_kernels)}",
        f"+{a}.model.override_config.attn_implementation={pol.attn_implementation}",
    ]


def fsdp_mixed_precision(dtype: str) -> str:
    """The Hydra value of an FSDP engine's `mixed_precision`: compute in the spec's `policy.dtype`, reduce gradients
    and keep buffers in fp32 (veRL's own defaults for those two).

    veRL 0.9.1's FSDP engine takes its compute dtype from `mixed_precision.param_dtype` alone and, when that is
    unset, computes in bf16 (`FSDPEngine._build_fsdp_module`: FSDP's param dtype and the forward's autocast);
    `fsdp_config.dtype` is read only by its Megatron engine. So a float32 spec trained in bf16 — on a CPU without
    bf16 instructions (AVX2 only) some six times slower than in fp32, and off the fp32 vLLM rollout's numbers."""
    return f"{{param_dtype:{dtype},reduce_dtype:fp32,buffer_dtype:fp32}}"


def _actor_overrides(exp: Experiment) -> list[str]:
    """The actor's update (PPO clip, KL loss) and the FSDP engine of the actor and the reference."""
    alg, pol = exp.spec.algorithm, exp.spec.policy
    a = _A
    return [
        f"{a}.actor.optim.lr={alg.learning_rate}",
        f"{a}.actor.ppo_mini_batch_size={alg.ppo_mini_batch_size}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu={alg.ppo_micro_batch_size_per_gpu}",
        f"{a}.actor.ppo_epochs={alg.ppo_epochs}",
        f"{a}.actor.clip_ratio={alg.clip_ratio}",
        f"{a}.actor.loss_agg_mode={alg.loss_agg_mode}",
        f"{a}.actor.use_kl_loss={_b(alg.kl.use_kl_loss)}",
        f"{a}.actor.kl_loss_coef={alg.kl.coef}",
        f"{a}.actor.kl_loss_type={alg.kl.type}",
        f"{a}.actor.entropy_coeff=0",
        f"{a}.actor.fsdp_config.param_offload={_b(pol.param_offload)}",
        f"{a}.actor.fsdp_config.optimizer_offload={_b(pol.optimizer_offload)}",
        # One FSDP engine on every device: FSDP2 (veRL's default is FSDP1, which needs an accelerator). Its LoRA
        # export gathers the sharded DTensors parameter by parameter (`collect_lora_params`), where FSDP1 wraps
        # the whole actor in `summon_full_params` at every weight sync (the fp32 full model beside the shard).
        *(f"{a}.{role}.{key}=fsdp2" for role in ("actor", "ref") for key in ("strategy", "fsdp_config.strategy")),
        *(
            f"+{a}.{role}.fsdp_config.mixed_precision={fsdp_mixed_precision(str(pol.dtype))}"
            for role in ("actor", "ref")
        ),
        f"{a}.ref.log_prob_micro_batch_size_per_gpu={alg.ppo_micro_batch_size_per_gpu}",
    ]


def _rollout_overrides(exp: Experiment, paths: Paths) -> list[str]:
    """The rollout: vLLM in server mode, multi-turn through longhaul's agent loop."""
    env, alg, pol, roll = exp.spec.environment, exp.spec.algorithm, exp.spec.policy, exp.spec.policy.rollout
    tool_chars = env.tool_output_limit or UNLIMITED_TOOL_CHARS
    a = _A
    return [
        f"{a}.rollout.name={roll.engine}",
        f"{a}.rollout.mode=async",
        f"{a}.rollout.dtype={pol.dtype}",
        # With LoRA, vLLM loads the base weights from the model path itself and every sync sends only the adapter.
        # On veRL's default (dummy weights) the first sync would also send the whole base model, gathered in fp32
        # on each rank's host, and a tensor larger than the transfer bucket (Qwen2.5-7B's 2 GiB embedding in fp32
        # against the 2048 MB default) takes a direct-send path that fails for host tensors (veRL 0.9.1).
        f"{a}.rollout.load_format={'auto' if pol.lora.rank else 'dummy'}",
        f"{a}.rollout.tensor_model_parallel_size={roll.tensor_parallel_size}",
        f"{a}.rollout.gpu_memory_utilization={roll.gpu_memory_utilization}",
        f"{a}.rollout.max_model_len={roll.max_model_len}",
        f"{a}.rollout.max_num_seqs={roll.max_num_seqs}",
        f"{a}.rollout.max_num_batched_tokens={roll.max_num_batched_tokens}",
        f"{a}.rollout.enforce_eager={_b(roll.enforce_eager)}",
        f"{a}.rollout.free_cache_engine={_b(roll.free_cache_engine)}",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu={alg.ppo_micro_batch_size_per_gpu}",
        f"{a}.rollout.n={alg.group_size}",
        f"{a}.rollout.temperature={roll.train.temperature}",
        f"{a}.rollout.top_p={roll.train.top_p}",
        f"{a}.rollout.seed={alg.seed}",
        f"{a}.rollout.calculate_log_probs=true",
        f"{a}.rollout.val_kwargs.n=1",
        f"{a}.rollout.val_kwargs.do_sample=true",
        f"{a}.rollout.val_kwargs.temperature={roll.validation.temperature}",
        f"{a}.rollout.val_kwargs.top_p={roll.validation.top_p}",
        f"{a}.rollout.multi_turn.enable=true",
        f"{a}.rollout.multi_turn.format=hermes",
        f"{a}.rollout.multi_turn.max_assistant_turns={env.max_turns}",
        f"{a}.rollout.multi_turn.max_user_turns={env.max_turns}",
        f"{a}.rollout.multi_turn.max_parallel_calls=1",
        f"{a}.rollout.multi_turn.max_tool_response_length={tool_chars}",
        f"{a}.rollout.multi_turn.tool_config_path={_q(paths.tool_config_file)}",
        f"{a}.rollout.agent.agent_loop_config_path={_q(paths.agent_loop_file)}",
        f"{a}.rollout.agent.default_agent_loop={AGENT_LOOP_NAME}",
    ]


def _trainer_overrides(exp: Experiment, paths: Paths) -> list[str]:
    """The trainer: logging, sizes, steps, checkpoints and the device."""
    s = exp.spec
    alg = s.algorithm
    cpu = s.resources.gpus_per_node == 0
    return [
        "trainer.logger=[console,mlflow]",
        f"trainer.project_name={_q(experiment_family(exp))}",
        f"trainer.experiment_name={_q(run_name(exp))}",
        f"trainer.nnodes={s.resources.nodes}",
        f"trainer.n_gpus_per_node={1 if cpu else len(trainer_gpu_ids(exp))}",
        # The v1 trainer is the one whose estimator receives the per-token rewards (rm_scores) that `credit: turn`
        # needs; its mode is the spec's (`algorithm.trainer.mode`, sync by default), never left to veRL's default.
        "trainer.use_v1=true",
        *_trainer_mode_overrides(exp),
        f"trainer.total_training_steps={alg.total_steps}",
        # veRL stops at whichever comes first, epochs or steps; every epoch has at least one step, so this
        # many epochs never end the run before total_steps.
        f"trainer.total_epochs={alg.total_steps}",
        f"trainer.save_freq={alg.save_freq}",
        f"trainer.test_freq={alg.test_freq}",
        f"trainer.val_before_train={_b(alg.test_freq > 0)}",
        f"trainer.default_local_dir={_q(paths.checkpoint_dir)}",
        "trainer.resume_mode=auto",
        f"trainer.rollout_data_dir={_q(paths.logs_dir + '/' + VERL_ROLLOUT_DUMP_SUBDIR)}",
        f"trainer.device={'cpu' if cpu else 'cuda'}",
    ]


def _trainer_mode_overrides(exp: Experiment) -> list[str]:
    """veRL's v1 trainer mode and its settings (`spec.algorithm.trainer`; docs/async-modes.md): the async modes'
    warm-up batches and staleness limit, separate_async's rollout GPUs, weight-sync cadence and hybrid rollout, and
    the off-policy correction (truncated importance weights) when one is chosen."""
    s = exp.spec
    t = s.algorithm.trainer
    out = [f"trainer.v1.trainer_mode={t.mode}"]
    if t.is_async:
        staleness = "null" if t.max_staleness is None else str(t.max_staleness)
        out += [
            f"trainer.v1.{t.mode}.num_warmup_batches={t.warmup_batches:g}",
            f"trainer.v1.sampler.max_off_policy_threshold={staleness}",
            f"trainer.v1.sampler.max_off_policy_strategy={t.stale}",
        ]
    if t.mode == TrainerMode.SEPARATE_ASYNC:
        alg = s.algorithm
        out += [
            f"trainer.v1.separate_async.parameter_sync_step={parameter_sync_step(alg.train_batch_size, alg.ppo_mini_batch_size)}",  # noqa: E501 - one override kept whole
            f"trainer.v1.separate_async.hybrid_rollout.enable_switch={_b(t.hybrid_rollout)}",
            # Without hybrid rollout the trainer's GPUs hold no rollout replicas at all (veRL's pure Actor role).
            f"{_A}.hybrid_engine={_b(t.hybrid_rollout)}",
            f"{_A}.rollout.nnodes={s.resources.nodes}",
            f"{_A}.rollout.n_gpus_per_node={t.rollout_gpus_per_node}",
            # veRL refuses 'naive' for the standalone replicas (trainer_separate_async.py:68).
            f"{_A}.rollout.checkpoint_engine.backend=nccl",
        ]
    if t.importance_sampling != ImportanceSampling.NONE:
        out += [
            f"algorithm.rollout_correction.rollout_is={t.importance_sampling}",
            f"algorithm.rollout_correction.rollout_is_threshold={t.importance_threshold!r}",
        ]
    return out


def override_key(line: str) -> str:
    """The dotted key of a Hydra override line (`+a.b=v` -> `a.b`)."""
    return line.split("=", 1)[0].lstrip("+~")


def merge_overrides(base: list[str], changes: list[str]) -> list[str]:
    """`base` with each key that `changes` sets replaced in place, and the keys it adds appended (Hydra refuses
    two values for one key)."""
    by_key = {override_key(c): c for c in changes}
    merged = [by_key.pop(override_key(b), b) for b in base]
    return merged + [c for c in changes if override_key(c) in by_key]


def render_chat_overrides(exp: Experiment) -> list[str]:
    """The policy's chat template and its keyword arguments (`spec.policy.thinking`, `longhaul.chat.thinking`):
    veRL's agent-loop worker installs `model.custom_chat_template` on the rollout tokenizer, and its
    continuous-token builder renders the first prompt and every appended message with
    `data.apply_chat_template_kwargs`. Nothing for models without a thinking mode."""
    out = [f"+data.apply_chat_template_kwargs.{k}={_b(v)}" for k, v in chat_template_kwargs(exp.spec.policy).items()]
    template = chat_template_override(exp.spec.policy)
    if template is not None:
        out.append(f"actor_rollout_ref.model.custom_chat_template={_q(template)}")
    return out


def render_cpu_overrides(exp: Experiment) -> list[str]:
    """What veRL on the CPU platform (`longhaul.verlcpu`, selected by VERL_PLATFORM=cpu in the stage environment)
    needs beyond the common list. The trainer, FSDP2 engines, agent loop and rollout engine are the GPU job's —
    veRL's own vLLM replica, here on vLLM's CPU build —; only the settings a CPU cannot take differ, each with its
    reason in `longhaul.render.devices.CPU_DIFFERENCES` (a test renders every GPU spec and its CPU twin and checks
    that the difference is exactly that list).

    One node: veRL starts its own local Ray with one logical "GPU" (the trainer rank's slot, which veRL's resource
    check counts). Several nodes: the job script has started a Ray cluster whose every node advertises one "GPU"
    and `CPU_RAY_SLOTS` CPUs (`cpu_ray_start_resources`), and veRL attaches to it through RAY_ADDRESS, where
    `ray.init` refuses resource arguments."""
    a = "actor_rollout_ref"
    out = [
        f"{a}.model.use_remove_padding=false",
        # vLLM's CPU build: no CUDA graphs, no sleep mode (the engine stays awake; its weights are re-sent by
        # every sync), no chunked prefill (the spec's validation keeps max_num_batched_tokens >= max_model_len).
        f"{a}.rollout.enforce_eager=true",
        f"{a}.rollout.free_cache_engine=false",
        f"+{a}.rollout.enable_sleep_mode=false",
        f"{a}.rollout.enable_chunked_prefill=false",
        f"{a}.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        *(f"+{a}.rollout.engine_kwargs.vllm.{k}={v}" for k, v in vllm_cpu_engine_args().items()),
    ]
    if exp.spec.resources.nodes == 1:
        res = cpu_ray_start_resources()  # what each node's `ray start` advertises when there are several
        out += [
            f"+ray_kwargs.ray_init.num_cpus={res['num_cpus']}",
            f"+ray_kwargs.ray_init.num_gpus={res['num_gpus']}",
            "+ray_kwargs.ray_init.include_dashboard=false",
        ]
    for role in ("actor", "ref"):
        out += [
            f"{a}.{role}.fsdp_config.use_torch_compile=false",
            f"{a}.{role}.use_torch_compile=false",
        ]
    return out


def cpu_ray_start_resources() -> dict[str, int]:
    """Logical resources each node's `ray start` advertises for a multi-node CPU run: one "GPU" (the node's
    trainer rank, see `render_cpu_overrides`) and `CPU_RAY_SLOTS` CPU scheduling slots."""
    return {"num_cpus": CPU_RAY_SLOTS, "num_gpus": 1}


#: Set in the job environment when the veRL driver attaches to a Ray cluster the job started (multi-node).
ENV_RAY_ADDRESS = "RAY_ADDRESS"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variable names that look like credentials (API keys, tokens, passwords): never rendered into an override.
_SECRET_NAME = re.compile(r"(?i)token|secret|passw|pwd|key|credential|auth")


def ray_job_env_overrides(stage_env: dict[str, str], inherited: dict[str, str]) -> list[str]:
    """Hydra overrides that hand veRL's Ray job the variables the launcher adds for its stage (`stage_env` minus
    what it `inherited` from the job): `+ray_kwargs.ray_init.runtime_env.env_vars.<NAME>=<value>`.

    A local Ray started by veRL's driver passes the driver's whole environment to every actor. When the driver
    attaches to a cluster the job script started (RAY_ADDRESS, multi-node), actors get the environment of their
    node's `ray start` instead — the job's, without the platform switch, the server URLs or the MLflow run the
    launcher sets — so the job-level runtime environment carries them to every node.

    Credentials never go this way: an override lands in veRL's printed config, its error messages and MLflow's
    params. A variable whose name looks like one (`_SECRET_NAME`) or whose value holds a URI with one
    (`longhaul.redact`) is left out; the job's own environment (every node's `ray start`) carries those."""
    return [
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}={_q(v)}"
        for k, v in sorted(stage_env.items())
        if inherited.get(k) != v and _ENV_NAME.fullmatch(k) and not _SECRET_NAME.search(k) and redact_value(v) == v
    ]
