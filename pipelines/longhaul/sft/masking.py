"""Render-Twice-Diff SFT labels (method.md i.2), with the prefix property checked per sample.

For every assistant message the label span is the token difference between the conversation rendered up to it
with the generation prompt and the conversation rendered including it. No special tokens are hard-coded: the chat
template decides what an assistant turn is, so the span covers the assistant's text, its rendered `<tool_call>`
JSON and the end-of-turn token(s) the template emits. Samples whose prefix renderings are not token prefixes of
the full rendering, that are longer than the limit, or that have too few label tokens are dropped with a
reason — never truncated.

Pure: the tokenizer is an argument; nothing is read or written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: Label value of tokens that do not contribute to the loss (PyTorch's cross-entropy ignore index).
IGNORE_INDEX = -100


class DropReason(StrEnum):
    """Why a sample is not in the dataset."""

    TOO_LONG = "too_long"  # the full rendering is longer than max_length
    PREFIX_MISMATCH = "prefix_mismatch"  # a prefix rendering is not a token prefix of the full rendering
    TOO_FEW_LABELS = "too_few_labels"  # fewer than min_label_tokens label tokens
    NO_ASSISTANT = "no_assistant"  # nothing to learn from


@dataclass(frozen=True)
class SupervisedExample:
    """Token ids, per-token labels (IGNORE_INDEX outside assistant spans) and the spans themselves."""

    input_ids: list[int]
    labels: list[int]
    spans: list[tuple[int, int]]  # [start, end) token ranges of the assistant turns

    @property
    def loss_mask(self) -> list[int]:
        return [0 if lab == IGNORE_INDEX else 1 for lab in self.labels]

    @property
    def num_label_tokens(self) -> int:
        return sum(end - start for start, end in self.spans)


@dataclass(frozen=True)
class Dropped:
    """A sample that was left out, and why (with the message index where the prefix property broke)."""

    reason: DropReason
    detail: str
    message_index: int | None = None


@dataclass
class BuildStats:
    """Counts for a whole dataset build."""

    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    label_tokens: int = 0
    total_tokens: int = 0
    max_tokens: int = 0

    def add(self, result: SupervisedExample | Dropped) -> None:
        if isinstance(result, Dropped):
            self.dropped[str(result.reason)] += 1
            return
        self.kept += 1
        self.label_tokens += result.num_label_tokens
        self.total_tokens += len(result.input_ids)
        self.max_tokens = max(self.max_tokens, len(result.input_ids))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "label_tokens": self.label_tokens,
            "total_tokens": self.total_tokens,
            "max_tokens": self.max_tokens,
            "label_fraction": round(self.label_tokens / self.total_tokens, 4) if self.total_tokens else 0.0,
        }


def render_ids(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: list[dict] | None,
    *,
    add_generation_prompt: bool,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the chat-template rendering (no extra BOS/EOS: the template is the whole truth). `chat_template`
    replaces the tokenizer's; `template_kwargs` are the template's variables (`longhaul.chat.thinking`)."""
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        chat_template=chat_template,
        **(template_kwargs or {}),
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_supervised_example(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: list[dict] | None,
    *,
    max_length: int,
    min_label_tokens: int = 1,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> SupervisedExample | Dropped:
    """Render-Twice-Diff labels for one conversation, or the reason it is dropped. `chat_template` and
    `template_kwargs` are the policy's (`longhaul.chat.thinking`), as training and evaluation render it."""
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistant_at:
        return Dropped(DropReason.NO_ASSISTANT, "the conversation has no assistant message")
    chat = {"chat_template": chat_template, "template_kwargs": template_kwargs}
    full = render_ids(tokenizer, messages, tools, add_generation_prompt=False, **chat)
    if len(full) > max_length:
        return Dropped(DropReason.TOO_LONG, f"{len(full)} tokens > max_length {max_length}")
    labels = [IGNORE_INDEX] * len(full)
    spans: list[tuple[int, int]] = []
    for ai in assistant_at:
        before = render_ids(tokenizer, messages[:ai], tools, add_generation_prompt=True, **chat)
        upto = render_ids(tokenizer, messages[: ai + 1], tools, add_generation_prompt=False, **chat)
        for name, ids in (("generation prompt", before), ("assistant turn", upto)):
            if full[: len(ids)] != ids:
                at = next((j for j, (a, b) in enumerate(zip(ids, full, strict=False)) if a != b), len(full))
                return Dropped(
                    DropReason.PREFIX_MISMATCH,
                    f"rendering up to message {ai} ({name}) is not a token prefix of the full rendering "
                    f"(first difference at token {at})",
                    message_index=ai,
                )
        if len(upto) <= len(before):
            return Dropped(
                DropReason.PREFIX_MISMATCH,
                f"message {ai} renders to no tokens after its generation prompt",
                message_index=ai,
            )
        labels[len(before) : len(upto)] = full[len(before) : len(upto)]
        spans.append((len(before), len(upto)))
    example = SupervisedExample(input_ids=full, labels=labels, spans=spans)
    if example.num_label_tokens < min_label_tokens:
        return Dropped(DropReason.TOO_FEW_LABELS, f"{example.num_label_tokens} label tokens < {min_label_tokens}")
    return example


def build_supervised_dataset(
    tokenizer: Any,
    conversations: Iterable[tuple[Sequence[dict[str, Any]], list[dict] | None]],
    *,
    max_length: int,
    min_label_tokens: int = 1,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[SupervisedExample], list[Dropped], BuildStats]:
    """Examples for every (messages, tools) pair; drops are returned and counted, never silently lost."""
    kept: list[SupervisedExample] = []
    dropped: list[Dropped] = []
    stats = BuildStats()
    for messages, tools in conversations:
        result = build_supervised_example(
            tokenizer,
            messages,
            tools,
            max_length=max_length,
            min_label_tokens=min_label_tokens,
            chat_template=chat_template,
            template_kwargs=template_kwargs,
        )
        stats.add(result)
        (dropped if isinstance(result, Dropped) else kept).append(result)
    return kept, dropped, stats
