"""CLI command groups; each module exposes `register(app)`.

A command imports what it runs inside its own function body: `longhaul --help` and every command start without
loading what the other commands need (the spec's models, the renderers, MLflow, the HTTP clients, veRL and torch).
Each such import says why on its line or the line above (`# deferred: …`; `tests/unit/test_import_discipline.py`).
The helpers every command shares live here, below the command modules, so that none imports another's module.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Console

if TYPE_CHECKING:
    from longhaul.spec import SpecError

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
    # deferred: the spec's path rules load pydantic (~0.1 s); only a command given --run-dir needs them
    from longhaul.spec.paths import write_path_problem

    if value is None:
        return None
    problem = write_path_problem(str(value))
    if problem:
        raise typer.BadParameter(f"{str(value)!r} {problem}")
    return value


def fail_on_spec_error(exc: SpecError) -> NoReturn:
    """Print every problem and exit 2 (nothing rendered, written or submitted)."""
    err = plain_console(stderr=True)
    for p in exc.problems:
        err.print(f"error {p.render()}")
    err.print(f"{len(exc.problems)} problem(s); nothing was rendered, written or submitted.")
    raise typer.Exit(2)
