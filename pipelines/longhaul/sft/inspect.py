"""Views of an SFT dataset for `longhaul sft inspect` (pure)."""

from __future__ import annotations

from collections import Counter
from typing import Any


def build_segments(tokenizer: Any, input_ids: list[int], loss_mask: list[int]) -> list[tuple[str, bool]]:
    """(text, trained) runs of consecutive tokens with the same mask value, decoded with special tokens kept."""
    out: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(input_ids) + 1):
        if i == len(input_ids) or bool(loss_mask[i]) != bool(loss_mask[start]):
            out.append((tokenizer.decode(input_ids[start:i], skip_special_tokens=False), bool(loss_mask[start])))
            start = i
    return out


def build_dataset_summary(rows: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """Counts over the rows, plus what the build dropped (from the stats file)."""
    tokens = [r["num_tokens"] for r in rows]
    labels = [r["num_label_tokens"] for r in rows]
    per_task = Counter(str(r["task_id"]) for r in rows)
    return {
        "samples": len(rows),
        "tasks": len(per_task),
        "samples per task": dict(sorted(per_task.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)),
        "tokens (total / mean / max)": f"{sum(tokens)} / {sum(tokens) / max(1, len(tokens)):.0f} / {max(tokens, default=0)}",  # noqa: E501 - a string literal kept whole
        "trained tokens (total / mean)": f"{sum(labels)} / {sum(labels) / max(1, len(labels)):.0f}",
        "trained fraction": round(sum(labels) / sum(tokens), 4) if tokens and sum(tokens) else 0.0,
        "dropped at build": stats.get("dropped", {}),
    }
