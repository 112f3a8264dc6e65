"""veRL on CPU: a `cpu` platform, FSDP engines for device `cpu` and a CPU rollout replica, for veRL 0.9.1.

This is how the demo and CI run the SAME trainer path as a GPU job — `python -m verl.trainer.main_ppo` (v1 sync
trainer, FSDP2 actor and reference, TransferQueue, longhaul's agent loop, weight sync, checkpoint, resume) —
with only the device changed. Everything goes through veRL's own extension points:

==========================  ==========================================================================  ========
what                        how                                                                         kind
==========================  ==========================================================================  ========
platform ``cpu``            ``PlatformRegistry.register("cpu")``; selected by ``VERL_PLATFORM=cpu``     official
torch device module         ``torch.cpu`` plus no-ops for the accelerator calls veRL makes              plugin
FSDP engines on ``cpu``     ``EngineRegistry.register(..., device="cpu")`` on veRL's own FSDP classes   official
rollout ``longhaul_cpu``    ``RolloutReplicaRegistry.register``: a token-in/token-out HF server actor    official
in-worker rollout adapter   ``_ROLLOUT_REGISTRY`` has no register function: one key is added            patch 1
reference model on FSDP2    the forward-only engine pins host memory (``CPUOffloadPolicy(pin_memory=    patch 2
                            True)``), which needs an accelerator: ``pin_memory=False`` on CPU
process group               veRL builds ``"cpu:gloo,cpu:gloo"`` (rejected by torch); the platform       call order
                            starts a plain gloo group first, so veRL skips its own init
resource accounting         veRL's resource check counts only GPU/NPU: Ray is started with one "GPU"    config
                            per trainer rank (``+ray_kwargs.ray_init.num_gpus``, rendered; several
                            nodes: ``ray start --num-gpus=1`` per node, one rank each, gloo across)
==========================  ==========================================================================  ========

Each patch is guarded: `longhaul.verlcpu.patches` checks that what it patches still looks as expected and
raises `VeRLChanged` otherwise, and tests/unit/verlcpu pin that, so a veRL upgrade fails loudly instead of
silently training differently.

Loading: `longhaul.verlcpu.plugin` is a `verl.plugins` entry point (pyproject.toml), imported by `import verl`
in every process (driver, TaskRunner, Ray workers). It does nothing unless the process runs with
``VERL_PLATFORM=cpu`` (the renderer's CPU branch sets it), so a GPU job is unaffected.
"""

from __future__ import annotations

import os

#: Environment variable that selects veRL's platform (read by veRL's platform manager).
ENV_PLATFORM = "VERL_PLATFORM"
#: The platform name registered here.
PLATFORM_NAME = "cpu"
#: `actor_rollout_ref.rollout.name` of the CPU rollout replica.
ROLLOUT_NAME = "longhaul_cpu"
#: The veRL version these extension points and patches were written and tested against.
SUPPORTED_VERL = "0.9.1"


def cpu_platform_selected(environ: dict[str, str] | None = None) -> bool:
    """True when this process runs veRL on the CPU platform (``VERL_PLATFORM=cpu``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_PLATFORM, "").strip().lower() == PLATFORM_NAME


def cpu_job_env() -> dict[str, str]:
    """Environment of a veRL stage on CPU: the platform switch, and one thread per process (a 2-core machine
    runs the trainer rank, the rollout server, the agent-loop worker and Ray at once)."""
    return {
        ENV_PLATFORM: PLATFORM_NAME,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
