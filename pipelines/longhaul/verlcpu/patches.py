"""The two places where veRL 0.9.1 offers no extension point for a CPU run, each patched minimally and guarded.

Every patch first checks that the code it changes still looks the way it was written against and raises
`VeRLChanged` (naming the file and what differs) when it does not: a veRL upgrade must fail loudly here, never
train differently in silence. tests/unit/verlcpu/test_patches.py runs the same checks against the installed veRL.
"""

from __future__ import annotations

import inspect
from typing import Any

from longhaul.verlcpu import ROLLOUT_NAME, SUPPORTED_VERL

#: Importable path of the in-worker rollout adapter (patch 1 registers it).
ADAPTER_PATH = "longhaul.verlcpu.rollout.CPUServerAdapter"


class VeRLChanged(RuntimeError):
    """The installed veRL no longer matches what a CPU patch was written against."""


def check_verl_version() -> str:
    """The installed veRL version; raises `VeRLChanged` when it is not the supported one."""
    import verl

    version = getattr(verl, "__version__", "?")
    if version != SUPPORTED_VERL:
        raise VeRLChanged(
            f"longhaul's CPU platform is written and tested against veRL {SUPPORTED_VERL}; found veRL {version}. "
            "Install the pinned version (pip install -e '.[cpu]') or re-check longhaul.verlcpu.patches"
        )
    return version


def register_rollout_adapter() -> None:
    """Patch 1: add `(longhaul_cpu, async)` to veRL's in-worker rollout adapter table.

    `verl.workers.rollout.base.get_rollout_class` resolves the adapter that lives inside each trainer worker
    (and receives the weights after every update) from the module-level dict `_ROLLOUT_REGISTRY`, which has no
    register function (the replica side has `RolloutReplicaRegistry.register`)."""
    from verl.workers.rollout import base

    table = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(table, dict) or ("vllm", "async") not in table:
        raise VeRLChanged(
            "verl/workers/rollout/base.py: expected a dict _ROLLOUT_REGISTRY keyed by (name, mode) with "
            f"('vllm', 'async'); found {type(table).__name__}. Register the CPU adapter through veRL's new API"
        )
    if "_ROLLOUT_REGISTRY[(rollout_name, mode)]" not in inspect.getsource(base.get_rollout_class):
        raise VeRLChanged("verl/workers/rollout/base.py: get_rollout_class no longer reads _ROLLOUT_REGISTRY")
    table[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


#: The line of veRL's FSDP engine that pins host memory for forward-only (reference) models.
_PINNED_OFFLOAD = "offload_policy = CPUOffloadPolicy(pin_memory=True)"


def unpin_forward_only_offload() -> None:
    """Patch 2: the FSDP2 engine builds forward-only (reference) models with `CPUOffloadPolicy(pin_memory=True)`;
    pinned host memory needs an accelerator. On CPU the same policy is built with `pin_memory=False`.

    The module's `CPUOffloadPolicy` name is replaced by a subclass whose constructor forces `pin_memory=False`
    (only that engine module looks the name up; torch's class is untouched)."""
    from verl.workers.engine.fsdp import transformer_impl as ti

    source = inspect.getsource(ti)
    policy = getattr(ti, "CPUOffloadPolicy", None)
    if policy is None or _PINNED_OFFLOAD not in source:
        raise VeRLChanged(
            "verl/workers/engine/fsdp/transformer_impl.py: expected the FSDP2 forward-only engine to build "
            f"`{_PINNED_OFFLOAD}`; the code changed — re-check whether a CPU reference model still needs a patch"
        )
    if getattr(policy, "longhaul_unpinned", False):
        return

    class UnpinnedCPUOffloadPolicy(policy):  # type: ignore[misc, valid-type]
        longhaul_unpinned = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["pin_memory"] = False
            super().__init__(*args, **kwargs)

    ti.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def check_process_group_order() -> None:
    """The call-order assumption behind `PlatformCPU.communication_backend_name` starting the process group:
    veRL must ask for the backend name before it checks `is_initialized()` and skip its own init afterwards."""
    from verl.utils import distributed

    source = inspect.getsource(distributed.initialize_global_process_group_ray)
    backend_at = source.find("get_nccl_backend()")
    guard_at = source.find("if not torch.distributed.is_initialized()")
    if backend_at < 0 or guard_at < 0 or backend_at > guard_at:
        raise VeRLChanged(
            "verl/utils/distributed.py: initialize_global_process_group_ray no longer builds the backend name "
            "before its is_initialized() guard; the CPU platform's gloo initialisation must be revisited"
        )


def check_resource_accounting() -> None:
    """veRL's resource check counts Ray "GPU"/"NPU" resources only; the CPU branch renders one fake Ray GPU per
    trainer rank. If veRL starts counting the platform's own resource name, that rendering can go."""
    from verl.single_controller.ray.base import ResourcePoolManager

    source = inspect.getsource(ResourcePoolManager._check_resource_available)
    if 'node_info.get("GPU", 0)' not in source:
        raise VeRLChanged(
            "verl/single_controller/ray/base.py: ResourcePoolManager._check_resource_available no longer counts "
            "Ray 'GPU' resources; re-check the CPU branch's +ray_kwargs.ray_init.num_gpus rendering"
        )
