"""CLI command groups; each module exposes `register(app)`.

A command imports what it runs inside its own function body: `longhaul --help` and every command start without
loading what the other commands need (the renderers, MLflow, the HTTP clients, veRL and torch).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

#: Width of tables written to a pipe or a file (a terminal uses its own): wide enough that no column is cut.
PIPED_WIDTH = 200


def table_console() -> Console:
    """A stdout console for commands that print tables: the terminal's width, or `PIPED_WIDTH` when piped. Markup
    is off, as on every console of the CLI (`plain_console`)."""
    return Console(highlight=False, soft_wrap=True, markup=False, width=None if sys.stdout.isatty() else PIPED_WIDTH)


def plain_console(*, stderr: bool = False) -> Console:
    """The console of a command's output (stdout) or its errors and notes (`stderr=True`). Rich's markup is off:
    what the CLI prints carries user text — file names, values, a model's words — that rich would otherwise read
    as markup (`[/INST]` raises, `[black on black]` hides the rest of the line). A style goes in `style=`, or in
    markup a caller asks for explicitly (`markup=True`) around text it has passed through `rich.markup.escape`."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True, markup=False)


def check_run_dir(value: Path | str | None) -> Path | str | None:
    """A `--run-dir` value held to the rules of the spec's output directories (`spec.paths.write_path_problem`):
    no option in disguise, no `..`, no system directory, no `$`, quote or space (the path reaches argv, veRL's
    Hydra overrides and MLflow). Raises typer.BadParameter, which names the option."""
    from longhaul.spec.paths import write_path_problem

    if value is None:
        return None
    problem = write_path_problem(str(value))
    if problem:
        raise typer.BadParameter(f"{str(value)!r} {problem}")
    return value
