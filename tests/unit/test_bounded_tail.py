"""`longhaul.bounded`: one JSON value of a file (typed errors, never a traceback) and the tail of a log that may be
huge, read in bounded chunks; the run-directory records built on them (`longhaul.submit.read_record`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from longhaul import bounded
from longhaul.submit import RecordError, read_record


def test_read_json_refuses_what_json_loads_would_raise_on(tmp_path: Path) -> None:
    cases = {
        "truncated": ('{"a": ', "not JSON"),
        "deep": ("[" * 100_000, "nested deeper"),
        "digits": ('{"a": ' + "9" * 5000 + "}", "not JSON a reader can take"),
        "binary": (b"\xff\xfe", "not UTF-8"),
    }
    for name, (content, fragment) in cases.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(bounded.InputError, match=fragment):
            bounded.read_json(path, bounded.SMALL_JSON)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(bounded.InputError, match="not a regular file"):
        bounded.read_json(tmp_path / "fifo", bounded.SMALL_JSON)


def test_a_huge_log_is_read_from_its_tail_in_bounded_chunks(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    with open(log, "wb") as fh:
        fh.write(b"head\n")
        fh.truncate(600 * bounded.MiB)
        fh.seek(0, os.SEEK_END)
        fh.write("tail ✓\n".encode())
    start = bounded.tail_start(log)
    assert start == log.stat().st_size - bounded.LOG_TAIL.max_bytes
    chunks = list(bounded.read_from(log, start))
    assert all(len(c) <= bounded.LOG_TAIL.max_record_bytes for c, _ in chunks)
    assert chunks[-1][0].endswith("tail ✓\n") and chunks[-1][1] == log.stat().st_size
    assert bounded.tail_start(tmp_path / "launcher.log") > 0
    small = tmp_path / "small.log"
    small.write_text("a\nb\n")
    assert bounded.tail_start(small) == 0 and [c for c, _ in bounded.read_from(small, 0)] == ["a\nb\n"]


def test_run_records_are_type_checked(tmp_path: Path) -> None:
    rec = tmp_path / "submit.json"
    rec.write_text('{"backend": "local", "pid": 12, "started": 1}')
    assert read_record(rec, {"backend": str}, {"pid": int, "started": float})["pid"] == 12
    for text, fragment in (
        ('{"backend": "local", "pid"', "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"pid": 1}', "backend: missing"),
        ('{"backend": "local", "pid": "x"}', "pid: must be int"),
        ('{"backend": "local", "pid": true}', "pid: must be int"),
    ):
        rec.write_text(text)
        with pytest.raises(RecordError, match=fragment) as info:
            read_record(rec, {"backend": str}, {"pid": int})
        assert str(rec) in str(info.value) and "submit the spec again" in str(info.value)
