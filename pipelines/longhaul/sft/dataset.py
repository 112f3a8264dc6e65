"""SFT dataset: teacher trajectories (JSONL from the collection stage) → Render-Twice-Diff rows → parquet for
veRL's SFT trainer (read by `longhaul.sft.verl_dataset.RenderTwiceDiffDataset`).

Every record is rendered with its own `tools` and `messages` exactly as the episode runner built them (policy
text and date line in the system message, the 14 tool schemas through the chat template), so SFT, RL and
evaluation see the same prompt. `build_sft_rows` is pure; `load_trajectories` / `write_dataset` do the file I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from longhaul import bounded
from longhaul.files import PLAIN, atomic_output
from longhaul.sft.masking import BuildStats, Dropped, build_supervised_example

#: Columns of the parquet file (input_ids and loss_mask are what veRL reads; the rest is provenance).
COLUMNS = (
    "input_ids",
    "loss_mask",
    "task_id",
    "attempt",
    "num_tokens",
    "num_label_tokens",
    "messages",
    "tools",
    "provenance",
)


class TestTaskInDataError(ValueError):
    """A trajectory of a test task reached the SFT data: refuse to build rather than train on it."""


def build_sft_rows(
    tokenizer: Any,
    records: Iterable[dict[str, Any]],
    *,
    max_length: int,
    min_label_tokens: int,
    test_task_ids: Iterable[str] = (),
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], Dropped]], BuildStats]:
    """Rows for every record that survives masking; dropped records are returned with the reason and counted.
    `chat_template` / `template_kwargs`: the policy's (`longhaul.chat.thinking`), as training renders it."""
    test = {str(t) for t in test_task_ids}
    rows: list[dict[str, Any]] = []
    dropped: list[tuple[dict[str, Any], Dropped]] = []
    stats = BuildStats()
    for n, rec in enumerate(records, 1):
        tid = str(rec.get("task_id"))
        if tid in test:
            raise TestTaskInDataError(
                f"record {n}: task {tid} is a test task of the spec's split; test tasks must "
                "never be in SFT data (re-collect with the spec's split)"
            )
        result = build_supervised_example(
            tokenizer,
            rec["messages"],
            rec.get("tools"),
            max_length=max_length,
            min_label_tokens=min_label_tokens,
            chat_template=chat_template,
            template_kwargs=template_kwargs,
        )
        stats.add(result)
        if isinstance(result, Dropped):
            dropped.append((rec, result))
            continue
        rows.append(
            {
                "input_ids": result.input_ids,
                "loss_mask": result.loss_mask,
                "task_id": tid,
                "attempt": int(rec.get("attempt", 0)),
                "num_tokens": len(result.input_ids),
                "num_label_tokens": result.num_label_tokens,
                "messages": json.dumps(rec["messages"], ensure_ascii=False),
                "tools": json.dumps(rec.get("tools"), ensure_ascii=False),
                "provenance": json.dumps(rec.get("provenance", {}), ensure_ascii=False),
            }
        )
    return rows, dropped, stats


def load_trajectories(path: Path) -> list[dict[str, Any]]:
    """Records of a trajectories JSONL file (bounded by `longhaul.bounded.SFT_TRAJECTORIES`), with the line
    number in errors."""
    out = []
    for i, rec in bounded.read_jsonl(path, bounded.SFT_TRAJECTORIES, expected="one trajectory record per line"):
        if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
            raise ValueError(f"{path}:{i}: a record needs a `messages` list (OpenAI chat format)")
        out.append(rec)
    return out


def write_dataset(rows: list[dict[str, Any]], path: Path, stats: BuildStats, *, tokenizer: str | None = None) -> None:
    """Write the parquet file and `<name>.stats.json` next to it (with the tokenizer used, for `inspect`)."""
    # deferred: pyarrow (~0.2 s)
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = (
        pa.table({c: [r[c] for r in rows] for c in COLUMNS})
        if rows
        else pa.table(
            {
                c: pa.array([], type=pa.list_(pa.int64()) if c in ("input_ids", "loss_mask") else pa.string())
                for c in COLUMNS
            }
        )
    )
    with atomic_output(path, mode=PLAIN) as tmp:
        pq.write_table(table, tmp)
    stats_path(path).write_text(
        json.dumps({**stats.to_dict(), "tokenizer": tokenizer}, indent=2) + "\n", encoding="utf-8"
    )


def stats_path(dataset: Path) -> Path:
    return Path(dataset).with_suffix(".stats.json")


def read_stats(dataset: Path) -> dict[str, Any]:
    """The build statistics next to a dataset ({} when absent)."""
    try:
        return json.loads(bounded.read_text(stats_path(dataset), bounded.SMALL_JSON))
    except FileNotFoundError:
        return {}


def read_dataset(path: Path) -> list[dict[str, Any]]:
    """Rows of a dataset parquet file as plain dicts."""
    # deferred: pyarrow (~0.2 s)
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()
