"""CLI command groups; each module exposes `register(app)`.

A command imports what it runs inside its own function body: `longhaul --help` and every command start without
loading what the other commands need (the renderers, MLflow, the HTTP clients, veRL and torch).
"""

from __future__ import annotations

import sys

from rich.console import Console

#: Width of tables written to a pipe or a file (a terminal uses its own): wide enough that no column is cut.
PIPED_WIDTH = 200


def table_console() -> Console:
    """A stdout console for commands that print tables: the terminal's width, or `PIPED_WIDTH` when piped."""
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else PIPED_WIDTH)
