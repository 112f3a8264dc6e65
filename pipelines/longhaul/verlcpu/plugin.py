"""`verl.plugins` entry point: activates the CPU platform in every veRL process that runs with VERL_PLATFORM=cpu.

`import verl` imports this module in the driver, the TaskRunner and every Ray worker (entry point in
pyproject.toml). veRL swallows exceptions raised by plugins (logged at DEBUG), which would turn a broken CPU
setup into an unrelated CUDA error later, so a failure here is printed to stderr with its cause and the
module records it in `ACTIVATION_ERROR`.
"""

from __future__ import annotations

import sys
import traceback

from longhaul.verlcpu import PLATFORM_NAME, cpu_platform_selected

ACTIVATION_ERROR: str | None = None


def register_engines() -> None:
    """veRL's FSDP engines (actor/ref and critic) for device `cpu`, through veRL's own `EngineRegistry`."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    registered = EngineRegistry._engines.get("language_model", {}).get("fsdp2", {})
    if PLATFORM_NAME in registered:
        return
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM_NAME)(
        FSDPEngineWithLMHead
    )
    EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device=PLATFORM_NAME)(
        FSDPEngineWithValueHead
    )


def activate() -> None:
    """Register the platform and the engines and apply the guarded patches (idempotent); the rollout patches wait
    for their modules (`longhaul.verlcpu.hooks`: only veRL's vLLM server and vLLM's workers import them)."""
    from verl.plugin.platform import PlatformRegistry

    from longhaul.verlcpu import hooks, patches
    from longhaul.verlcpu.platform import PlatformCPU

    patches.check_verl_version()
    patches.check_process_group_order()
    patches.check_resource_accounting()
    PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    register_engines()
    patches.unpin_forward_only_offload()
    hooks.after_import(patches.SHM_RECEIVER_MODULE, patches.copy_shared_memory_buckets)
    hooks.after_import(patches.VLLM_LINEAR_MODULE, patches.keep_live_linear_weights)
    hooks.after_import(patches.VLLM_MAPPER_MODULE, patches.name_vllm_rename_mapper)


if cpu_platform_selected():
    try:
        activate()
    except Exception:  # noqa: BLE001 - veRL would swallow it; say it loudly, then let veRL fail on the platform
        ACTIVATION_ERROR = traceback.format_exc()
        print(
            f"longhaul: the veRL CPU platform could not be activated:\n{ACTIVATION_ERROR}", file=sys.stderr, flush=True
        )
