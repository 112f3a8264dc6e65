"""The launch plan: what the in-container launcher runs for a spec on a backend (pure).

Every backend ends in the same launcher (`longhaul launch`), which executes this plan: start the colocated
servers, wait for health, run the stages in order, stop the servers. Rendering it as a value means the plan
is printed by `longhaul render --backend local`, pinned by golden files, and executed unchanged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from longhaul import constants as C
from longhaul.chat.thinking import chat_template_kwargs, chat_template_override
from longhaul.layout import Paths
from longhaul.render.jobenv import job_env
from longhaul.render.verl import _q, render_verl_overrides
from longhaul.spec.models import Experiment, Stage
from longhaul.spec.naming import experiment_family, run_name, spec_hash
from longhaul.spec.placement import trainer_gpu_ids
from longhaul.spec.serving import ModelRef
from longhaul.spec.simulator import GpuShare, Placement, Quantization
from longhaul.verlcpu import cpu_job_env, vllm_cpu_engine_args, vllm_cpu_server_env

LOOPBACK = "127.0.0.1"
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
VERL_TRAINER_MODULE = "verl.trainer.main_ppo"
SIMULATOR_ROLE = "simulator"
POLICY_ROLE = "policy"


@dataclass(frozen=True)
class ServerPlan:
    """An OpenAI-compatible vLLM server the launcher starts, health-checks and stops."""

    role: str
    argv: tuple[str, ...]
    env: dict[str, str]
    host: str
    port: int
    served_model_name: str
    startup_timeout_s: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self.port}/health"


@dataclass(frozen=True)
class StagePlan:
    """One stage. `argv` is a command to run; empty argv = run inside the launcher (e.g. evaluation)."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchPlan:
    run_name: str
    spec_hash: str
    backend: str
    paths: Paths
    env: dict[str, str]
    simulator: ServerPlan | None
    policy_server: ServerPlan
    stages: tuple[StagePlan, ...]
    simulator_base_url: str

    @property
    def servers(self) -> tuple[ServerPlan, ...]:
        """Servers that live for the whole job (the colocated simulator)."""
        return (self.simulator,) if self.simulator else ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("simulator", "policy_server"):
            if d[key] is not None:
                server = getattr(self, key)
                d[key]["base_url"] = server.base_url
                d[key]["health_url"] = server.health_url
        return d


def model_location(model: ModelRef) -> str:
    """What to pass to `--model`: the baked path if given, else the repo id (resolved offline in HF_HOME)."""
    return model.path or model.name


def _gpu_list(start: int, count: int) -> str:
    return ",".join(str(i) for i in range(start, start + count))


def _server_env(visible: str | None) -> dict[str, str]:
    """A server's environment: its GPU positions in the job's mask (`longhaul.render.gpus`), or None on the CPU,
    where the server gets vLLM-CPU's process layout instead (`vllm_cpu_server_env`)."""
    env = {"VLLM_HOST_IP": LOOPBACK}
    if visible is not None:
        env[C.CUDA_MASK_VAR] = visible
    else:
        env.update(vllm_cpu_server_env())
    return env


def _vllm_argv(
    python: str,
    model: ModelRef,
    served_name: str,
    port: int,
    *,
    tp: int,
    mem: float,
    max_model_len: int,
    max_num_seqs: int,
    dtype: str,
    enforce_eager: bool,
    quantization: Quantization | None,
    cpu: bool,
    tool_calls: bool,
    batched_tokens: int = 0,
    extra: tuple[str, ...] = (),
) -> tuple[str, ...]:
    argv = [
        python,
        "-m",
        VLLM_SERVER_MODULE,
        "--model",
        model_location(model),
        "--served-model-name",
        served_name,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--dtype",
        dtype,
        "--seed",
        "0",
    ]
    if model.revision and not model.path:
        argv += ["--revision", model.revision]
    if not cpu:
        argv += ["--tensor-parallel-size", str(tp), "--gpu-memory-utilization", str(mem)]
    else:
        # vLLM-CPU crashes ("CPU Generator does not use offset") when a seeded request's prefill is chunked
        # (long prompts, concurrent requests): whole prefills only, with a token budget of a full context.
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, batched_tokens))]
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in vllm_cpu_engine_args().items()]
    if quantization and quantization != Quantization.NONE:
        argv += ["--quantization", str(quantization)]
    if enforce_eager or cpu:  # no CUDA graphs on the CPU, as for veRL's CPU rollout (render.devices)
        argv.append("--enforce-eager")
    if tool_calls:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    return (*argv, *extra)


def render_simulator_server(exp: Experiment, python: str = "python") -> ServerPlan | None:
    """The colocated user-simulator server, or None when the simulator is external."""
    sim = exp.spec.user_simulator
    if sim.placement == Placement.EXTERNAL:
        return None
    cpu = exp.spec.resources.gpus_per_node == 0
    gpus = exp.spec.resources.gpus_per_node
    start = gpus - sim.tensor_parallel_size if sim.gpu_share == GpuShare.DEDICATED else 0
    argv = _vllm_argv(
        python,
        sim.model,
        sim.model.name,
        sim.port,
        tp=sim.tensor_parallel_size,
        mem=sim.gpu_memory_utilization,
        max_model_len=sim.max_model_len,
        max_num_seqs=sim.max_num_seqs,
        dtype="auto" if sim.quantization != Quantization.NONE else str(exp.spec.policy.dtype),
        enforce_eager=sim.enforce_eager,
        quantization=sim.quantization,
        cpu=cpu,
        tool_calls=False,
    )
    return ServerPlan(
        SIMULATOR_ROLE,
        argv,
        _server_env(None if cpu else _gpu_list(start, sim.tensor_parallel_size)),
        LOOPBACK,
        sim.port,
        sim.model.name,
        sim.startup_timeout_s,
    )


def render_chat_args(exp: Experiment) -> tuple[str, ...]:
    """The policy server's chat template and its default keyword arguments (`spec.policy.thinking`), so that
    evaluation renders every turn's context as training built it (`longhaul.chat.thinking`): the template is
    passed as text (vLLM takes a literal template), the keyword arguments as JSON. Nothing for models without a
    thinking mode."""
    args: list[str] = []
    template = chat_template_override(exp.spec.policy)
    if template is not None:
        args += ["--chat-template", template]
    kwargs = chat_template_kwargs(exp.spec.policy)
    if kwargs:
        args += ["--default-chat-template-kwargs", json.dumps(kwargs, sort_keys=True)]
    return tuple(args)


def render_policy_server(exp: Experiment, model_dir: str | None = None, python: str = "python") -> ServerPlan:
    """The policy server used for evaluation (and CPU rollouts): serves `model_dir` or the base policy."""
    pol = exp.spec.policy
    model = pol.model if model_dir is None else ModelRef(name=pol.model.name, path=model_dir)
    cpu = exp.spec.resources.gpus_per_node == 0
    roll = pol.rollout
    port = exp.spec.backends.local.policy_port
    trainer_gpus = trainer_gpu_ids(exp)
    argv = _vllm_argv(
        python,
        model,
        pol.model.name,
        port,
        tp=roll.tensor_parallel_size,
        mem=roll.gpu_memory_utilization,
        max_model_len=roll.max_model_len,
        max_num_seqs=roll.max_num_seqs,
        dtype=str(pol.dtype),
        enforce_eager=roll.enforce_eager,
        quantization=None,
        cpu=cpu,
        tool_calls=True,
        batched_tokens=roll.max_num_batched_tokens,
        extra=render_chat_args(exp),
    )
    if exp.spec.backends.local.policy_server_cmd and cpu:
        argv = (*exp.spec.backends.local.policy_server_cmd, *argv[3:])
    visible = None if cpu else _gpu_list(trainer_gpus[0] if trainer_gpus else 0, roll.tensor_parallel_size)
    return ServerPlan(
        POLICY_ROLE,
        argv,
        _server_env(visible),
        LOOPBACK,
        port,
        pol.model.name,
        exp.spec.user_simulator.startup_timeout_s,
    )


def stage_refusal(exp: Experiment, stage: str | None) -> str | None:
    """Why `--stage <stage>` cannot run for `exp` (not one of its stages), or None: checked before anything is
    written (`longhaul run`) and by the launcher itself."""
    names = [str(s) for s in exp.spec.stages]
    if stage is None or stage in names:
        return None
    return f"--stage {stage}: not in this spec's stages ({', '.join(names)})"


def render_job_env(exp: Experiment, backend: str, paths: Paths) -> dict[str, str]:
    """Environment every process the launcher starts gets: the job environment (`longhaul.render.jobenv`), with
    the spec file the launcher keeps in the run directory (a backend may have mounted it elsewhere), plus where
    the agent loop writes its traces, the MLflow experiment and the spec's tracking URI when it names one."""
    env = job_env(backend, run_name(exp), paths.run_dir, paths.spec_file)
    env.update({C.ENV_ROLLOUT_DIR: paths.rollouts_dir, "MLFLOW_EXPERIMENT_NAME": experiment_family(exp)})
    if exp.spec.tracking.uri:
        env["MLFLOW_TRACKING_URI"] = exp.spec.tracking.uri
    return env


def render_stages(exp: Experiment, backend: str, paths: Paths) -> tuple[StagePlan, ...]:
    """The stages in order; the veRL stage carries its full Hydra override list."""
    common = ("--spec", paths.spec_file, "--run-dir", paths.run_dir)
    stages: list[StagePlan] = []
    for stage in exp.spec.stages:
        if stage == Stage.SFT:
            stages.append(StagePlan(stage.value, ("longhaul", "sft", "run", *common)))
        elif stage == Stage.GRPO:
            overrides = render_verl_overrides(exp, paths)
            env = cpu_job_env() if exp.spec.resources.gpus_per_node == 0 else {}
            # Hydra's own output directory goes to the run's logs, not the working directory.
            hydra_dir = f"hydra.run.dir={_q(paths.logs_dir + '/hydra')}"
            stages.append(StagePlan(stage.value, ("python", "-m", VERL_TRAINER_MODULE, *overrides, hydra_dir), env))
        else:  # evaluation runs inside the launcher (`longhaul.launcher.stages.IN_PROCESS`): no command
            stages.append(StagePlan(stage.value, ()))
    return tuple(stages)


def render_plan(exp: Experiment, backend: str, run_dir: str, *, server_python: str = "python") -> LaunchPlan:
    """The launch plan for `exp` on `backend` with outputs under `run_dir` (pure)."""
    paths = Paths.under(run_dir)
    sim = exp.spec.user_simulator
    simulator = render_simulator_server(exp, server_python)
    sim_url = simulator.base_url if simulator else (sim.url or "")
    return LaunchPlan(
        run_name=run_name(exp),
        spec_hash=spec_hash(exp),
        backend=backend,
        paths=paths,
        env=render_job_env(exp, backend, paths),
        simulator=simulator,
        policy_server=render_policy_server(exp, python=server_python),
        stages=render_stages(exp, backend, paths),
        simulator_base_url=sim_url,
    )
