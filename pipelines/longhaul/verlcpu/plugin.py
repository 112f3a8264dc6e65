"""`verl.plugins` entry point: activates the CPU platform in every veRL process that runs with VERL_PLATFORM=cpu,
and, on every platform, the fix of veRL's FSDP2 wrapping for its fused log-prob forward (patch 5).

`import verl` imports this module in the driver, the TaskRunner and every Ray worker (entry point in
pyproject.toml). veRL swallows exceptions raised by plugins (logged at DEBUG), which would turn a broken CPU
setup into an unrelated CUDA error later, so a failure here is printed to stderr with its cause and the
module records it in `ACTIVATION_ERROR`.
"""

from __future__ import annotations

import sys
import traceback

from longhaul.verlcpu import PLATFORM_NAME, cpu_platform_selected, hooks, patches

ACTIVATION_ERROR: str | None = None
FUSED_HEAD_ERROR: str | None = None


def register_engines() -> None:
    """veRL's FSDP engines (actor/ref and critic) for device `cpu`, through veRL's own `EngineRegistry`."""
    # deferred: veRL imports this module while it loads (plugin entry point)
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
    # deferred: veRL imports this module while it loads; the platform loads torch (seconds)
    from verl.plugin.platform import PlatformRegistry

    # deferred: the CPU platform loads torch and veRL (seconds)
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
    hooks.after_import(patches.VLLM_ASYNC_LLM_MODULE, patches.accept_verl_pause_keyword)


def fix_fused_head() -> None:
    """Patch 5 on every platform (a GPU trainer worker included): applied when veRL's FSDP utilities are first
    imported, so only processes that build FSDP models import them. A veRL that no longer matches the patch
    raises `VeRLChanged` from that import: the worker stops there, naming what changed, instead of failing
    later on a sharded lm_head (or training on an unchecked veRL). Already imported, it is patched now."""

    hooks.after_import(patches.FSDP_UTILS_MODULE, patches.keep_fused_head_in_root)


try:
    fix_fused_head()
except Exception:  # noqa: BLE001 - the module was imported already and veRL would swallow this: say it loudly
    FUSED_HEAD_ERROR = traceback.format_exc()
    print(f"longhaul: veRL's FSDP2 lm_head wrapping was not fixed:\n{FUSED_HEAD_ERROR}", file=sys.stderr, flush=True)

if cpu_platform_selected():
    try:
        activate()
    except Exception:  # noqa: BLE001 - veRL would swallow it; say it loudly, then let veRL fail on the platform
        ACTIVATION_ERROR = traceback.format_exc()
        print(
            f"longhaul: the veRL CPU platform could not be activated:\n{ACTIVATION_ERROR}", file=sys.stderr, flush=True
        )
