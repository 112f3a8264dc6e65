"""A short supervised warm start of the tiny policy on gold-action conversations (Render-Twice-Diff labels).

It only has to teach the output format (`<tool_call>` JSON with a known tool name, then `<|im_end|>`), so it is
a plain single-process loop: AdamW, linear warm-up then cosine decay, one conversation per step, seeded order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from longhaul.sft.masking import IGNORE_INDEX, SupervisedExample


@dataclass(frozen=True)
class WarmStartResult:
    steps: int
    first_loss: float
    last_loss: float  # mean of the last 20 steps


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to `peak`, then cosine decay to 10 % of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def label_loss(model: Any, ex: SupervisedExample) -> Any:
    """Next-token cross-entropy on the label positions only: the LM head runs on those few positions instead of
    the whole ~5k-token sequence (most of it is the shared system prompt)."""
    import torch

    ids = torch.tensor([ex.input_ids])
    targets = torch.tensor(ex.labels[1:])
    keep = (targets != IGNORE_INDEX).nonzero(as_tuple=True)[0]
    hidden = model.model(input_ids=ids).last_hidden_state[0, keep]
    logits = model.lm_head(hidden)
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def warm_start(
    model: Any,
    examples: Sequence[SupervisedExample],
    *,
    steps: int,
    seed: int,
    learning_rate: float = 3e-3,
    on_step: Callable[[int, float], None] | None = None,
) -> WarmStartResult:
    """Train `model` in place for `steps` steps on `examples` (one per step, seeded shuffle)."""
    import torch

    if not examples:
        raise ValueError("warm start needs at least one example")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    order: list[int] = []
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, min(20, steps // 10))
    losses: list[float] = []
    for step in range(steps):
        if not order:
            order = list(range(len(examples)))
            rng.shuffle(order)
        ex = examples[order.pop()]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, learning_rate, warmup)
        loss = label_loss(model, ex)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    tail = losses[-20:]
    return WarmStartResult(steps=steps, first_loss=losses[0], last_loss=sum(tail) / len(tail))
