"""The CLI-wide rule: no user input ends in a Python traceback.

Every command answers a refused input itself (a spec problem, a bounded reader's `InputError`, a bad option) with
one line naming the file, line and field. What a command does not foresee — a bug, or an input nobody thought
of — is caught here, once, for every registered command: `GuardedGroup.main` prints one line that names the
file (an `OSError`'s path, or the paths among the command's arguments) and what failed, and exits non-zero
(`EXIT_USER_PATH` when the operating system refused a path the user gave, `EXIT_UNEXPECTED` otherwise). The
traceback is shown only with `longhaul --debug …` (`DEBUG_FLAG`), before the command name.

The message is made safe to print: one line, control characters replaced, URLs redacted (`longhaul.redact`),
cut to `MAX_MESSAGE_CHARS`. The exception's chained causes are never printed (a parser's error can quote the
file it was reading).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from typer.core import TyperGroup

from longhaul.redact import redact_uri

#: `longhaul --debug COMMAND …` shows the traceback of an unexpected error instead of the one-line message.
DEBUG_FLAG = "--debug"
#: Exit code of an unexpected error (a bug, or an input no check foresaw).
EXIT_UNEXPECTED = 1
#: Exit code when the operating system refused a path the user gave (a file where a directory is needed, …):
#: the same code as every other refused input.
EXIT_USER_PATH = 2
#: The one line is cut to this many characters.
MAX_MESSAGE_CHARS = 400

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def wants_debug(argv: Sequence[str]) -> bool:
    """Whether `--debug` is among the options before the command name."""
    for arg in argv:
        if arg == DEBUG_FLAG:
            return True
        if not arg.startswith("-"):
            return False
    return False


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` as one printable line: control characters (newlines included) become one space, URLs are redacted,
    and the result is cut to `limit` characters."""
    text = _CONTROL.sub(" ", _URL.sub(lambda m: redact_uri(m.group()), text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _paths_among(argv: Sequence[str]) -> list[str]:
    """The arguments that name an existing file or directory (the inputs an error is most likely about)."""
    found = []
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.startswith("-") or not value or len(value) > 4096:
            continue
        try:
            if "://" in value:  # a store given as a URI (sqlite:///runs/x/mlflow.db, file:///…): its path
                path = urlsplit(value).path
                value = path.removeprefix("/") if value.startswith("sqlite:///") else path
            if value and os.path.lexists(value):
                found.append(value)
        except (OSError, ValueError):  # NUL in the name, name too long
            continue
    return found


def describe_unexpected(exc: BaseException, argv: Sequence[str]) -> tuple[str, int]:
    """The one-line message and exit code for an exception no command caught."""
    command = " ".join(a for a in argv if not a.startswith("-"))[:60] or "longhaul"
    if isinstance(exc, OSError) and exc.filename is not None:
        what = exc.strerror or type(exc).__name__
        where = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
        return one_line(f"error {where}: {what}; nothing further was done"), EXIT_USER_PATH
    where = getattr(exc, "file", None) or ", ".join(_paths_among(argv)[:3]) or command
    detail = str(exc) if not isinstance(exc, KeyError) else f"missing key {exc.args[0]!r}" if exc.args else ""
    if isinstance(exc, RecursionError):
        detail = "the input is nested too deeply"
    elif isinstance(exc, MemoryError):
        detail = "the input needs more memory than this machine has"
    message = (
        f"error {where}: unexpected {type(exc).__name__}"
        + (f" ({one_line(detail, 200)})" if detail else "")
        + f" in `longhaul {command.split(' ')[0]}`; this is a bug in longhaul or an input it does not check yet: "
        f"rerun as `longhaul {DEBUG_FLAG} …` for the traceback"
    )
    return one_line(message), EXIT_UNEXPECTED


class GuardedGroup(TyperGroup):
    """The root command group: runs the command and turns any exception it did not handle into one line and a
    non-zero exit (module docstring). `typer.testing.CliRunner` and the console script both enter here."""

    def main(self, args: Sequence[str] | None = None, *pargs: Any, **kwargs: Any) -> Any:
        """Run the command line `args` (default `sys.argv[1:]`)."""
        argv = list(sys.argv[1:] if args is None else args)
        standalone = kwargs.get("standalone_mode", True)
        try:
            return super().main(argv, *pargs, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the one place that catches what no command foresaw
            if wants_debug(argv):
                raise
            message, code = describe_unexpected(exc, argv)
            sys.stdout.flush()
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
            if standalone:
                sys.exit(code)
            return code
