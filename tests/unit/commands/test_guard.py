"""The CLI-wide rule (issue 30): an exception no command foresaw is one safe line and a non-zero exit; `--run-dir`
is held to the spec's write-path rules. (Every registered command is held to it in
tests/reliability/test_hostile_inputs.py.)"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import typer

from longhaul.commands import check_run_dir
from longhaul.commands.guard import EXIT_UNEXPECTED, EXIT_USER_PATH, describe_unexpected, one_line, wants_debug


def test_one_line_is_one_printable_redacted_line() -> None:
    text = one_line("a\nb\x00c\u2028d http://user:s3cret@host:5000/x?token=abc " + "z" * 1000)
    assert "\n" not in text and "\x00" not in text and "s3cret" not in text and "token=abc" not in text
    assert text.startswith("a b c d http://user:***@host:5000") and len(text) <= 400 and text.endswith("…")


def test_describe_names_the_file_of_an_os_error_and_the_input_of_anything_else(tmp_path: Path) -> None:
    msg, code = describe_unexpected(FileExistsError(errno.EEXIST, "File exists", "out.txt"), ["render", "x.yaml"])
    assert code == EXIT_USER_PATH and msg == "error out.txt: File exists; nothing further was done"
    spec = tmp_path / "s.yaml"
    spec.write_text("x: 1\n")
    msg, code = describe_unexpected(KeyError("turns"), ["explain", str(spec), "--json"])
    assert code == EXIT_UNEXPECTED and msg.startswith(f"error {spec}: unexpected KeyError (missing key 'turns')")
    assert "longhaul --debug" in msg
    msg, _ = describe_unexpected(RecursionError("maximum recursion depth exceeded"), ["plan", str(spec)])
    assert "nested too deeply" in msg
    msg, _ = describe_unexpected(ValueError("bad"), ["compare", "--tracking-uri", f"sqlite:///{spec}"])
    assert msg.startswith(f"error {spec}: unexpected ValueError (bad)")


def test_debug_is_an_option_before_the_command() -> None:
    assert wants_debug(["--debug", "explain", "x"]) and not wants_debug(["explain", "--debug"])
    assert not wants_debug(["explain", "x"])


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("${oc.env:HOME}", "not allowed"),
        ("runs/$(id)", "not allowed"),
        ("my runs", "not allowed"),
        ("/etc/longhaul", "system directory"),
        ("/proc/self/x", "system directory"),
        ("../x", "'..' is not allowed"),
        ("-rf", "option"),
        ("~/runs", "not expanded"),
        ("/", "root directory"),
    ],
)
def test_run_dir_values_follow_the_specs_write_path_rules(value: str, fragment: str) -> None:
    with pytest.raises(typer.BadParameter, match=fragment):
        check_run_dir(value)


def test_plain_run_dirs_pass() -> None:
    for value in ("runs/mine", "/scratch/runs/x-1", "/tmp/r", Path("runs") / "a"):
        assert check_run_dir(value) == value
    assert check_run_dir(None) is None
