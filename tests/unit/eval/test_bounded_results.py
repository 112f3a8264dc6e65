"""`longhaul eval summarize` and `--tasks` read user input through `longhaul.bounded` (RESULTS, TASK_IDS):
oversized lines, too many records, deep nesting and huge id lists are refused with one line naming the file
(or option) and line, fast and in little memory."""

from __future__ import annotations

import dataclasses
import json
import time
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longhaul import bounded
from longhaul.cli import app
from longhaul.eval.evaluate import load_records

RECORD = {"task_id": "0", "trial": 0, "success": True, "subset": "train", "subsets": ["train"]}


def _refused(path: Path) -> tuple[str, float, int]:
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(bounded.InputError) as exc:
            load_records(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return str(exc.value), time.monotonic() - t0, peak


def test_results_line_longer_than_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "results.jsonl"
    big = json.dumps({**RECORD, "pad": "x" * bounded.RESULTS.max_record_bytes})
    f.write_text(json.dumps(RECORD) + "\n" + big + "\n" + json.dumps(RECORD) + "\n")
    msg, seconds, peak = _refused(f)
    assert msg.startswith(f"{f}:2: line is longer than the 1 MiB limit of a results JSONL file"), msg
    assert "\n" not in msg and seconds < 5 and peak < 100 * 2**20


def test_results_with_too_many_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The real limit (200,000) costs ~0.7 s of decoding legitimate records first; a smaller one shows the same.
    monkeypatch.setattr(bounded, "RESULTS", dataclasses.replace(bounded.RESULTS, max_records=1_000))
    f = tmp_path / "results.jsonl"
    f.write_text("{}\n\n" * 1_001)
    msg, seconds, peak = _refused(f)
    assert msg.startswith(f"{f}:2001: more than 1,000 records, over the 1,000 limit of a results JSONL file"), msg
    assert seconds < 5 and peak < 100 * 2**20


def test_results_file_larger_than_the_limit_is_not_read(tmp_path: Path) -> None:
    f = tmp_path / "results.jsonl"
    with f.open("wb") as fh:  # sparse: 1 GiB on paper, nothing on disk
        fh.write((json.dumps(RECORD) + "\n").encode())
        fh.truncate(2**30)
    msg, seconds, peak = _refused(f)
    assert msg.startswith(
        f"{f}:2: file is larger than the 64 MiB limit of a results JSONL file (1,073,741,824 bytes"
    ), msg
    assert seconds < 5 and peak < 10 * 2**20


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, ":1: nested deeper than the 64 levels"),  # past the decoder's recursion
        ('{"a": ' * 65 + "1" + "}" * 65, ":1 a.a.a.a"),  # decodes, then refused by depth with its path
        ('{"task_id": 1,', ":1: not JSON (Expecting property name"),
        ('{"task_id": "caf\udce9"}', ":1: not UTF-8 text"),
    ],
)
def test_results_deep_or_malformed_lines(tmp_path: Path, line: str, needle: str) -> None:
    f = tmp_path / "results.jsonl"
    f.write_bytes(line.encode("utf-8", "surrogateescape") + b"\n")
    msg, seconds, _ = _refused(f)
    assert f"{f}{needle}" in msg and "\n" not in msg and seconds < 5, msg


def test_summarize_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "results.jsonl"
    f.write_text(json.dumps(RECORD) + "\n" + "[" * 50_000 + "\n")
    res = CliRunner().invoke(app, ["eval", "summarize", str(f)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error {f}:2: nested deeper"), res.output


def test_huge_task_id_lists_are_refused_before_splitting() -> None:
    huge = ",".join(str(i % 50) for i in range(bounded.TASK_IDS.max_records + 1))
    t0 = time.monotonic()
    with pytest.raises(bounded.InputError, match=r"^--tasks: 10,001 ids, over the 10,000 limit of a task-id list"):
        bounded.split_ids(huge)
    with pytest.raises(bounded.InputError, match="characters, over the 1 MiB limit"):
        bounded.split_ids("1" * (2**20 + 1))
    with pytest.raises(bounded.InputError, match="a task id longer than 64 characters"):
        bounded.split_ids("1," + "9" * 65)
    assert time.monotonic() - t0 < 5
    assert bounded.split_ids(" 1, 2,,3 ") == ["1", "2", "3"]


@pytest.mark.parametrize(
    "cmd",
    [
        ["eval", "--policy-url", "http://127.0.0.1:9/v1", "--user-url", "http://127.0.0.1:9/v1", "--no-progress"],
        ["env", "replay-gold"],
    ],
)
def test_task_id_options_refuse_huge_lists(cmd: list[str]) -> None:
    huge = ",".join(str(i % 50) for i in range(20_000))
    res = CliRunner().invoke(app, [*cmd, "--tasks", huge])
    assert res.exit_code == 2, res.output
    assert "--tasks: 20,000 ids, over the 10,000 limit" in res.output and "Traceback" not in res.output


def test_eval_never_prints_an_endpoint_password(tmp_path) -> None:
    """URLs with credentials are shown redacted in the start line and in the error when the endpoint is down."""
    secret = "S3cr3tPw"
    port = 9  # discard: nothing listens, the connection is refused at once
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--policy-url", f"http://agent:{secret}@127.0.0.1:{port}/v1",
            "--user-url", f"http://sim:{secret}@127.0.0.1:{port}/v1?api_key={secret}",
            "--tasks", "0", "--samples", "1", "--k", "1", "--retries", "1", "--timeout", "2", "--no-progress",
            "-o", str(tmp_path / "out"),
        ],
    )  # fmt: skip
    assert res.exit_code != 0
    assert secret not in res.output, res.output
    assert "http://agent:***@127.0.0.1:9/v1" in res.output
