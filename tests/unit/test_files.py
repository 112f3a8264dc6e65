"""Atomic writes (`longhaul.files`): whole files only, and the mode each caller had before they shared one writer."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from longhaul.files import PLAIN, atomic_output, atomic_write_bytes, atomic_write_json, atomic_write_text


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_run_files_are_private_and_plain_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        private = atomic_write_json(tmp_path / "a" / "plan.json", {"x": 1})
        plain = atomic_write_text(tmp_path / "b" / "out.yaml", "y: 2\n", mode=PLAIN)
    finally:
        os.umask(old)
    assert private.read_text() == '{\n  "x": 1\n}\n' and _mode(private) == 0o600
    assert plain.read_text() == "y: 2\n" and _mode(plain) == 0o644
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = atomic_write_text(tmp_path / "f.txt", "old")
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]  # fails inside the temporary file
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_writer_by_name_publishes_the_whole_file_when_its_block_ends(tmp_path: Path) -> None:
    """`atomic_output`: the writer (pyarrow, a JSONL appended to while episodes run) gets a temporary file of the
    caller's mode; `path` keeps its old content until the block ends, then has all the new content."""
    target = atomic_write_text(tmp_path / "out" / "results.jsonl", "old\n", mode=PLAIN)
    old = os.umask(0o022)
    try:
        with atomic_output(target, mode=PLAIN) as tmp:
            assert tmp.parent == target.parent and tmp.read_text() == "" and _mode(tmp) == 0o644
            for line in ("a\n", "b\n"):
                with tmp.open("a", encoding="utf-8") as fh:
                    fh.write(line)
                assert target.read_text() == "old\n"
        private = atomic_output(tmp_path / "new" / "private.bin")
        with private as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(old)
    assert target.read_text() == "a\nb\n" and _mode(target) == 0o644
    assert _mode(tmp_path / "new" / "private.bin") == 0o600
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_a_writer_that_raises_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = atomic_write_text(tmp_path / "results.jsonl", "old\n")
    with pytest.raises(KeyboardInterrupt), atomic_output(target) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt  # a stop request in the middle of an evaluation
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]
