"""`longhaul` command line. Each area registers its commands from `longhaul.commands.<area>`.

No input ends in a traceback: the root group (`longhaul.commands.guard.GuardedGroup`) turns anything a command
did not handle into one line naming the file and exits non-zero; `longhaul --debug COMMAND …` shows the traceback.
"""

from __future__ import annotations

import typer

from longhaul.commands import compare as _compare
from longhaul.commands import env as _env
from longhaul.commands import eval as _eval
from longhaul.commands import explain as _explain
from longhaul.commands import guard as _guard
from longhaul.commands import images as _images
from longhaul.commands import plan as _plan
from longhaul.commands import power as _power
from longhaul.commands import run as _run
from longhaul.commands import sft as _sft
from longhaul.commands import spec as _spec
from longhaul.commands import submit as _submit
from longhaul.commands import tiny as _tiny

app = typer.Typer(
    name="longhaul",
    help="Train long-horizon tool-using LLM agents with GRPO from declarative Experiment specs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_guard.GuardedGroup,
)


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, _guard.DEBUG_FLAG, help="Show the Python traceback of an unexpected error instead of one line."
    ),
) -> None:
    """Train long-horizon tool-using LLM agents with GRPO from declarative Experiment specs."""


# Registration order = order in `longhaul --help`. One line per area.
_spec.register(app)
_plan.register(app)
_run.register(app)
_submit.register(app)
_images.register(app)
_env.register(app)
_eval.register(app)
_explain.register(app)
_compare.register(app)
_power.register(app)
_tiny.register(app)
_sft.register(app)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
