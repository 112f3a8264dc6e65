"""veRL's `cpu` platform: what veRL asks of an accelerator, answered for the host CPU.

veRL reaches the device through `get_platform()` (device name, communication backend, Ray resource name) and
`get_torch_device()` (the platform's `device_module`: `torch.cuda`-like calls such as `empty_cache`,
`mem_get_info`, RNG state and memory statistics). `torch.cpu` has only a few of those, so `device_module` is a
small module that forwards what exists and answers the rest with no-ops or host figures.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psutil
import torch
from verl.plugin.platform import PlatformBase

from longhaul.verlcpu import ENV_PLATFORM, PLATFORM_NAME

#: The default process group's timeout (a loaded 2-core CPU step can take minutes).
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)


def _none(*_: Any, **__: Any) -> None:
    return None


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _host_memory(*_: Any, **__: Any) -> tuple[int, int]:
    """(free, total) bytes of host memory, as `torch.cuda.mem_get_info` reports for a GPU."""
    vm = psutil.virtual_memory()
    return vm.available, vm.total


def build_device_module() -> types.ModuleType:
    """A `torch.cuda`-shaped module for the CPU: `torch.cpu`'s functions plus the calls veRL makes on it."""
    mod = types.ModuleType("longhaul_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    overrides = {
        # veRL formats f"{device_name}:{current_device()}" and calls .to(current_device()): keep an index.
        "current_device": lambda: 0,
        "device_count": lambda: 1,
        "is_available": lambda: True,
        "set_device": _none,
        "synchronize": _none,
        "empty_cache": _none,
        "ipc_collect": _none,
        "reset_peak_memory_stats": _none,
        "set_per_process_memory_fraction": _none,
        "mem_get_info": _host_memory,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "get_device_name": lambda *_, **__: "cpu",
        "get_rng_state": lambda *_, **__: torch.get_rng_state(),
        "set_rng_state": lambda state, *_, **__: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
    }
    for name, fn in overrides.items():
        setattr(mod, name, fn)
    return mod


_DEVICE_MODULE = build_device_module()


def init_default_process_group() -> None:
    """Start the default process group with plain gloo from torchrun-style variables, if not started yet.

    veRL builds the backend string ``f"cpu:gloo,{device}:{backend}"`` before it checks whether a group exists;
    on CPU that is ``"cpu:gloo,cpu:gloo"``, which torch rejects. veRL asks the platform for its backend name
    first, so the group is created here and veRL's own init is then skipped."""
    # deferred: torch.distributed, only when a process group is started
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        return
    dist.init_process_group(
        backend="gloo",
        rank=int(os.environ.get("RANK", "0")),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=PROCESS_GROUP_TIMEOUT,
    )
    # One line per rank in the trainer's log: where each rank runs (the multi-node tests read it).
    print(
        f"longhaul cpu platform: gloo rank {dist.get_rank()}/{dist.get_world_size()} on Ray node {_ray_node_id()}",
        flush=True,
    )


def _ray_node_id() -> str:
    """This process's Ray node id, or "-" outside Ray."""
    try:
        # deferred: ray (~1 s), asked only inside Ray workers
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "-"
    except Exception:  # diagnostics only: never fail the process group over it
        return "-"


class PlatformCPU(PlatformBase):
    """The host CPU as a veRL platform. Never auto-detected: only ``VERL_PLATFORM=cpu`` selects it."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get(ENV_PLATFORM, "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> Any:
        # veRL passes this to `tensor.to(...)` and `FSDP(device_id=...)`, where the integer 0 means cuda:0.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        init_default_process_group()
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # veRL's resource check counts only "GPU"/"NPU"; Ray is started with one "GPU" per trainer rank.
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        # No CUDA IPC on the host: veRL's vLLM rollout then sends weights through shared memory by itself.
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        # Read by veRL's vLLM replica when it starts the engine's server actor. The engine's KV-cache budget is an
        # engine argument (`engine_kwargs.vllm.kv_cache_memory_bytes`, rendered), not a variable.
        return {}

    def cudart(self) -> Any:
        return None
