"""A FIFO (or any non-regular file) handed to longhaul is refused at once with a one-line error: opening and
reading it would wait for a writer forever (#30). Through the real CLI, with a timeout that a hang would hit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from longhaul import bounded


@pytest.fixture()
def fifo(tmp_path):
    path = tmp_path / "input.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    "argv", [["validate", "{f}"], ["explain", "{f}"], ["plan", "{f}"], ["power", "--from-comparison", "{f}"]]
)
def test_the_cli_refuses_a_fifo_without_waiting(fifo, argv):
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *(a.format(f=fifo) for a in argv)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "not a regular file" in out and str(fifo) in out, out
    assert "Traceback" not in out
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("reader", [bounded.read_text, bounded.read_jsonl])
def test_every_bounded_reader_refuses_a_fifo(fifo, reader):
    with pytest.raises(bounded.InputError, match="not a regular file"):
        reader(fifo, bounded.RESULTS)


def test_regular_files_and_links_to_them_are_read(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"a": 1}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(f)
    assert bounded.read_jsonl(link, bounded.RESULTS) == [(1, {"a": 1})]
    with pytest.raises(IsADirectoryError):
        bounded.read_text(tmp_path, bounded.SPEC)
