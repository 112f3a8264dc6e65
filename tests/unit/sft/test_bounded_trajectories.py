"""SFT trajectories are read through `longhaul.bounded.SFT_TRAJECTORIES` (size, line length, records, depth)."""

from __future__ import annotations

import dataclasses
import json
import time
import tracemalloc
from pathlib import Path

import pytest

from longhaul import bounded
from longhaul.sft.dataset import load_trajectories

RECORD = {"task_id": "0", "messages": [{"role": "user", "content": "hi"}]}


def test_valid_records_and_messages_check_keep_their_line_numbers(tmp_path: Path) -> None:
    f = tmp_path / "trajectories.jsonl"
    f.write_text(json.dumps(RECORD) + "\n\n" + json.dumps(RECORD) + "\n")
    assert len(load_trajectories(f)) == 2
    f.write_text(json.dumps(RECORD) + "\n\n" + json.dumps({"task_id": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"trajectories.jsonl:3: a record needs a `messages` list"):
        load_trajectories(f)


def test_line_longer_than_the_limit_is_refused_without_reading_it(tmp_path: Path) -> None:
    f = tmp_path / "trajectories.jsonl"
    pad = "x" * (bounded.SFT_TRAJECTORIES.max_record_bytes + 10)
    f.write_text(json.dumps(RECORD) + "\n" + json.dumps({**RECORD, "pad": pad}) + "\n")
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(bounded.InputError) as exc:
            load_trajectories(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(exc.value).startswith(f"{f}:2: line is longer than the 4 MiB limit of an SFT trajectories JSONL file")
    assert time.monotonic() - t0 < 5 and peak < 100 * 2**20


def test_too_many_records_and_deep_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "SFT_TRAJECTORIES", dataclasses.replace(bounded.SFT_TRAJECTORIES, max_records=3))
    f = tmp_path / "trajectories.jsonl"
    f.write_text((json.dumps(RECORD) + "\n") * 4)
    with pytest.raises(bounded.InputError, match=r"trajectories.jsonl:4: more than 3 records, over the 3 limit"):
        load_trajectories(f)
    deep = {**RECORD, "provenance": json.loads('{"a": ' * 70 + "1" + "}" * 70)}
    f.write_text(json.dumps(deep) + "\n")
    with pytest.raises(bounded.InputError, match=r":1 provenance\.a\.a.*nested deeper than the 64 levels"):
        load_trajectories(f)
