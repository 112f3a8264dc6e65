"""The actor as veRL 0.9.1's FSDP engine builds it, rebuilt from torch and transformers alone.

What each step mirrors in the pinned sources (verl/workers/engine/fsdp/transformer_impl.py, verl/utils/fsdp_utils.py):
  * `_build_module`: the Hugging Face model in `fsdp_config.model_dtype` (fp32 for a training actor), then
    `gradient_checkpointing_enable(use_reentrant=False)`. Here the model is built on the meta device: no full copy
    is ever materialized, only this rank's shards (veRL's rank 0 loads the checkpoint on the host and broadcasts
    it; that transient is host memory and is not measured).
  * `_build_lora_module`: PEFT's `get_peft_model` with `LoraConfig(r, lora_alpha, target_modules)`, after
    `enable_input_require_grads()`. PEFT is not required here: `LoRALinear` has PEFT's parameter shapes and
    forward (`base(x) + lora_B(lora_A(x)) * alpha / r`, dropout 0 as veRL's default) and "all-linear" means
    PEFT's rule (every nn.Linear but the output layer).
  * `apply_fsdp2` / `_select_fsdp2_wrap_targets`: `fully_shard` on every decoder layer (`_no_split_modules`) and,
    when the embeddings are not tied, on `embed_tokens` and `lm_head` by name, then on the root, with
    `MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=True)` and `reshard_after_forward`.
    longhaul's fix of that selection for veRL's fused forward (patch 5 of longhaul.verlcpu, applied in every veRL
    worker) leaves an untied `lm_head` to the root unit: `shard_actor` applies the same rule, from the bundle's
    copy of pipelines/longhaul/verlcpu/fused_head.py (`head_rule`).
    The process group is torch's fake backend (`torch.testing._internal.distributed.fake_pg`) with the spec's
    world size: this process is rank 0, collectives are no-ops, but every buffer FSDP allocates is real, so a
    rank's memory is measured on one GPU.
"""

from __future__ import annotations

import math
import types

import torch
from torch import nn

try:  # torch >= 2.6 exports FSDP2 here; 2.4-2.5 had it under _composable
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - older torch on a GPU machine
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPES.update({"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16})


def init_fake_world(world: int) -> None:
    """Make this process rank 0 of a `world`-rank fake process group (once per process)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())


class LoRALinear(nn.Module):
    """PEFT's LoRA layer on one frozen nn.Linear: `lora_A` (r x in) and `lora_B` (out x r), both bias-free."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=base.weight.device)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=base.weight.device)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The base projection plus the scaled low-rank update (PEFT casts the input to the adapter's dtype)."""
        result = self.base_layer(x)
        return result + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling


def _lora_targets(model: nn.Module, target_modules) -> list[tuple[nn.Module, str, nn.Linear]]:
    output = model.get_output_embeddings()
    wanted = None if target_modules in ("all-linear", None) else set(target_modules)
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if not isinstance(child, nn.Linear) or child is output:
                continue
            if wanted is None or name in wanted:
                found.append((parent, name, child))
    return found


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(all parameters, trainable parameters) of the unsharded model (call before sharding)."""
    total = sum(p.numel() for p in model.parameters())
    return total, sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_actor(config: dict, settings: dict, attn_implementation: str) -> nn.Module:
    """The actor on the meta device: Hugging Face model, checkpointing and LoRA as veRL configures them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "torch_dtype")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=attn_implementation)
        model.to(DTYPES[settings["model_dtype"]])
        if settings["gradient_checkpointing"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if settings["lora_rank"] > 0:
            model.enable_input_require_grads()
            for p in model.parameters():
                p.requires_grad_(False)
            for parent, name, linear in _lora_targets(model, settings["target_modules"]):
                setattr(parent, name, LoRALinear(linear, settings["lora_rank"], settings["lora_alpha"]))
            for m in model.modules():
                if isinstance(m, LoRALinear):
                    m.lora_A.to(DTYPES[settings["model_dtype"]])
                    m.lora_B.to(DTYPES[settings["model_dtype"]])
    model.config.use_cache = False
    return model


def shard_actor(model: nn.Module, settings: dict, device: torch.device, head_rule=None) -> nn.Module:
    """Wrap like veRL's `apply_fsdp2` on a fake mesh of `settings["world"]` ranks, then materialize this rank's
    shards on `device` with small random values (the weights' values do not change what is allocated). With
    `head_rule` (longhaul's fused_head module), its `keep_output_layer_in_root` edits veRL's selection as
    longhaul's patch does in a veRL worker; without it, veRL's selection alone."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh(device.type, list(range(settings["world"])))
    mp = MixedPrecisionPolicy(
        param_dtype=DTYPES[settings["param_dtype"]],
        reduce_dtype=DTYPES[settings["reduce_dtype"]],
        cast_forward_inputs=True,
    )
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": settings["reshard_after_forward"]}
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    targets = [
        module
        for name, module in model.named_modules()
        if type(module).__name__ in layer_classes
        or (isinstance(module, nn.Embedding) and not tied)
        or (not tied and name.rsplit(".", 1)[-1] in ("embed_tokens", "lm_head") and hasattr(module, "weight"))
    ]
    if head_rule is not None:
        targets = head_rule.keep_output_layer_in_root(model, targets, fused_forward=settings["use_fused_kernels"])
    for module in targets:
        fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    model.to_empty(device=device)
    _fill(model)
    return model


@torch.no_grad()
def _fill(model: nn.Module) -> None:
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if name.endswith("norm.weight"):
            local.fill_(1.0)
        elif "lora_B" in name:
            local.zero_()
        else:
            local.normal_(0.0, 0.02)
    for module in model.modules():
        inv = getattr(module, "inv_freq", None)
        if isinstance(inv, torch.Tensor) and inv.numel():
            # to_empty left the rotary buffer uninitialized; the standard RoPE frequencies keep outputs finite
            dim = 2 * inv.numel()
            theta = _rope_theta(model.config)
            inv.copy_(1.0 / theta ** (torch.arange(0, dim, 2, device=inv.device, dtype=torch.float32) / dim))
        orig = getattr(module, "original_inv_freq", None)
        if isinstance(orig, torch.Tensor) and isinstance(inv, torch.Tensor) and orig.shape == inv.shape:
            orig.copy_(inv)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def ppo_forward(self, input_ids, position_ids=None, fused=None, temperature=1.0, chunk_size=512):
    """veRL's `forward_with_torch_backend` (verl/models/transformers/dense_common.py), bound to the root module so
    FSDP2's root hooks run: the base model's hidden states, labels rolled by one, then the fused log-prob kernel
    on `self.lm_head.weight` — read outside lm_head's own forward, which is why an untied lm_head must be in the
    root unit (`probe_fused_wiring`)."""
    hidden = self.model(input_ids=input_ids, position_ids=position_ids).last_hidden_state
    labels = torch.roll(input_ids, shifts=-1, dims=-1)
    return fused.FusedLinearForPPOFunction.apply(hidden, self.lm_head.weight, labels, temperature, chunk_size)


def bind_ppo_forward(model: nn.Module) -> None:
    """Install `ppo_forward` as the module's forward (veRL patches the class; an instance attribute is enough)."""
    model.forward = types.MethodType(ppo_forward, model)


def head_in_root(model: nn.Module) -> bool:
    """True when the output layer has no FSDP unit of its own (its weight is the root unit's)."""
    return not hasattr(model.lm_head, "unshard")


def _run_wiring(config: dict, settings: dict, fused, device: torch.device, head_rule) -> dict:
    model = build_actor(config, settings, "sdpa")
    bind_ppo_forward(model)
    shard_actor(model, settings, device, head_rule)
    ids = torch.randint(0, config["vocab_size"], (1, 32), device=device)
    out = {"ok": True, "message": None, "head_in_root": head_in_root(model)}
    try:  # the forward is where the wiring meets a sharded lm_head, if it does
        with torch.no_grad():
            model(ids, fused=fused, chunk_size=settings["fused_chunk_size"])
    except Exception as exc:  # the probe's answer is the exception itself
        out.update(ok=False, message=f"{type(exc).__name__}: {str(exc).splitlines()[0][:240]}")
    return out


def probe_fused_wiring(config: dict, settings: dict, fused, device: torch.device, head_rule) -> dict:
    """Run veRL's fused log-prob wiring on a tiny model of the case's family, as a veRL worker runs it with
    longhaul's fix (`ok`, `message`, `head_in_root`), and with veRL's wrap selection alone (`verl_alone`): under
    FSDP2 with untied embeddings veRL wraps `lm_head` on its own, so outside its forward its weight is a sharded
    DTensor and `hidden @ weight.t()` mixes a Tensor with a DTensor; the fix leaves lm_head to the root unit."""
    result = _run_wiring(config, settings, fused, device, head_rule)
    result["verl_alone"] = _run_wiring(config, settings, fused, device, None)
    return result


def lora_shapes_check(total: int, trainable: int, plan_shape: dict | None) -> dict:
    """The built model's parameter counts beside the plan's header figures (printed to 3 digits: 1 % apart)."""
    plan_shape = plan_shape or {}
    out = {"params": total, "trainable": trainable,
           "plan_total": plan_shape.get("total"), "plan_trainable": plan_shape.get("trainable")}  # fmt: skip
    pairs = [(total, out["plan_total"]), (trainable, out["plan_trainable"])]
    out["ok"] = all(math.isclose(a, b, rel_tol=0.01) for a, b in pairs if b)
    return out
