"""Which modules FSDP2 shards on their own when veRL's fused log-prob forward reads the output layer's weight.

veRL 0.9.1's `apply_fsdp2` gives an untied `lm_head` a `fully_shard` unit of its own; its weight is then a
sharded DTensor everywhere except inside `lm_head`'s own forward. veRL's fused forwards never call `lm_head`:
they pass `self.lm_head.weight` to the fused log-prob kernel, which fails with "aten.mm.default got mixed
torch.Tensor and DTensor". Left out of the separate units, the output layer belongs to the root unit instead —
the wiring veRL already uses for a tied head: the root's pre-forward hook unshards it (in `param_dtype`), the
kernel sees a plain tensor, its gradient is reduce-scattered with the root's (in `reduce_dtype`).

Self-contained on purpose (no import at all): scripts/gpu_check/prepare.py copies this file into the one-GPU
check's bundle, which runs without longhaul and veRL, so the check shards its actor with this same rule.
`longhaul.verlcpu.patches.keep_fused_head_in_root` applies it inside veRL's `apply_fsdp2`.
"""

from __future__ import annotations

from typing import Any

#: The attribute name veRL's fused forwards read the output weight from (`self.lm_head.weight`).
OUTPUT_LAYER = "lm_head"


def head_is_tied(model: Any) -> bool:
    """True when the output layer shares the input embedding's weight (veRL's own test: the config's flag)."""
    return bool(getattr(model.config, "tie_word_embeddings", False))


def output_layers(model: Any) -> list[Any]:
    """The modules named `lm_head` (at any depth: PEFT nests the causal LM under `base_model.model`)."""
    return [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == OUTPUT_LAYER]


def keep_output_layer_in_root(model: Any, targets: list[Any], *, fused_forward: bool) -> list[Any]:
    """`targets` (the modules to `fully_shard` before the root) without the output layer when the model's forward
    reads `lm_head.weight` outside `lm_head`'s forward and the head is untied; otherwise `targets` unchanged."""
    if not fused_forward or head_is_tied(model):
        return list(targets)
    heads = {id(m) for m in output_layers(model)}
    return [m for m in targets if id(m) not in heads]
