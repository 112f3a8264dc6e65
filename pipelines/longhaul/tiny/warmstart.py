"""A short supervised warm start of the tiny policy on gold-action conversations (Render-Twice-Diff labels).

It only has to teach the output format (`<tool_call>` JSON with a known tool name, then `<|im_end|>`), so it is
a plain single-process loop: AdamW, linear warm-up then cosine decay, one conversation per step, seeded order.
"""

from __future__ import annotations

import copy
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
    """Linear warm-up to `peak`, then cosine decay to zero: the last steps barely move the weights, so the warm
    start ends settled in its minimum instead of wherever a large last step left it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


def shared_prefix(sequences: Sequence[Sequence[int]]) -> list[int]:
    """The longest token prefix every sequence starts with, one token short of the shortest (so each keeps a
    token to run)."""
    first = sequences[0]
    n = min(len(s) for s in sequences) - 1
    for s in sequences[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return list(first[: max(0, n)])


def common_prefix_len(examples: Sequence[SupervisedExample]) -> int:
    """Length of the token prefix shared by every example (the system prompt: policy text + tool schemas)."""
    n = len(shared_prefix([e.input_ids for e in examples]))
    # Never a label inside the prefix.
    first_label = min(e.spans[0][0] for e in examples)
    return max(0, min(n, first_label - 1))


def encode_prefix(model: Any, prefix_ids: list[int]) -> Any:
    """Key/value cache of the shared prefix under the current weights (no gradient)."""
    # deferred: torch (~1 s)
    import torch

    with torch.no_grad():
        return model.model(input_ids=torch.tensor([prefix_ids]), use_cache=True).past_key_values


def label_loss(model: Any, ex: SupervisedExample, prefix_cache: Any = None, prefix_len: int = 0) -> Any:
    """Next-token cross-entropy on the label positions only.

    With `prefix_cache` (the shared system prompt's keys/values, see `encode_prefix`) only the tokens after
    `prefix_len` are run with gradients, attending to the cached prefix; the LM head runs on the label positions
    only. The system prompt is ~4.4k of ~5.5k tokens, so this is several times cheaper than a full forward.
    """

    # deferred: torch (~1 s)
    import torch

    ids = ex.input_ids[prefix_len:]
    targets = torch.tensor(ex.labels[prefix_len + 1 :] + [IGNORE_INDEX])
    keep = (targets != IGNORE_INDEX).nonzero(as_tuple=True)[0]
    kwargs: dict[str, Any] = {}
    if prefix_cache is not None and prefix_len:
        kwargs["past_key_values"] = copy.deepcopy(prefix_cache)
        kwargs["position_ids"] = torch.arange(prefix_len, prefix_len + len(ids)).unsqueeze(0)
    hidden = model.model(input_ids=torch.tensor([ids]), use_cache=bool(kwargs), **kwargs).last_hidden_state[0, keep]
    logits = model.lm_head(hidden)
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def warm_start(
    model: Any,
    examples: Sequence[SupervisedExample],
    *,
    steps: int,
    seed: int,
    learning_rate: float = 3e-3,
    prefix_refresh: int = 10,
    on_step: Callable[[int, float], None] | None = None,
    stop_after: Callable[[int], bool] | None = None,
) -> WarmStartResult:
    """Train `model` in place for at most `steps` steps on `examples` (one per step, seeded shuffle); the learning
    rate follows `lr_at` over `steps`. `stop_after(step)`, asked after each step, ends training early when true.

    The shared system prompt is encoded without gradients and re-encoded every `prefix_refresh` steps (its
    keys/values lag the weights by at most that many steps); 0 = always run the full sequence.
    """
    # deferred: torch (~1 s)
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
    prefix_len = common_prefix_len(examples) if prefix_refresh else 0
    cache = None
    for step in range(steps):
        if prefix_len and step % prefix_refresh == 0:
            cache = encode_prefix(model, examples[0].input_ids[:prefix_len])
        if not order:
            order = list(range(len(examples)))
            rng.shuffle(order)
        ex = examples[order.pop()]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, learning_rate, warmup)
        loss = label_loss(model, ex, cache, prefix_len)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
        if stop_after is not None and stop_after(step):
            break
    model.eval()
    tail = losses[-20:]
    return WarmStartResult(steps=len(losses), first_loss=losses[0], last_loss=sum(tail) / len(tail))
