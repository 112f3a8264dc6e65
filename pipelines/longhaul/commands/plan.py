"""`longhaul plan SPEC`: the memory plan per GPU and per phase, and the check `validate` and `submit` run.

Exit codes of `plan`: 0 every phase fits; 1 a phase is over capacity or an engine cannot start; 2 the spec is
invalid or a model's shape is unknown. `validate` prints the same findings as warnings (exit code unchanged);
`submit` refuses (exit 2) unless `--ignore-memory-plan`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from longhaul import bounded
from longhaul.commands import fail_on_spec_error, plain_console

if TYPE_CHECKING:
    from longhaul.memory import Issue
    from longhaul.spec import Experiment

err = plain_console(stderr=True)
out = plain_console()


@dataclass(frozen=True)
class MemoryCheck:
    """What `validate` and `submit` report: blocking findings, warnings, or why there is no plan."""

    blocking: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: str | None = None


def _line_of(file: Path, dotted: str) -> int | None:
    """The line of `dotted` in `file` (or of its nearest parent present), from the spec loader's own positions."""
    # deferred: the spec loader's pydantic models (~0.2 s); its YAML positions are the one place for file:line
    from longhaul.spec.load import SpecError, _compose

    try:
        _, located = _compose(bounded.read_text(file, bounded.SPEC), str(file))
    except (SpecError, OSError, bounded.InputError):
        return None
    return located.line_for(tuple(dotted.split(".")))


def check_memory(exp: Experiment, file: Path) -> MemoryCheck:
    """The memory plan's findings for `exp`, each as `file:line field: message; hint`."""
    # deferred: the memory plan renders the launch plan (~0.3 s with the spec's models)
    from longhaul.memory.load import UnknownModel, load_memory_plan
    from longhaul.spec import Problem

    try:
        plan = load_memory_plan(exp)
    except UnknownModel as exc:
        return MemoryCheck(skipped=str(exc))

    def render(issue: Issue) -> str:
        return Problem(str(file), _line_of(file, issue.field), issue.field, issue.message, hint=issue.hint).render()

    return MemoryCheck(tuple(render(i) for i in plan.blocking), tuple(render(i) for i in plan.warnings))


def warn_memory(exp: Experiment, file: Path) -> None:
    """`validate`: print the memory plan's findings as warnings; never changes the exit code."""
    check = check_memory(exp, file)
    if check.skipped:
        err.print(f"note {file}: memory plan skipped: {check.skipped}")
    for line in (*check.blocking, *check.warnings):
        err.print(f"warning {line}")
    if check.blocking:
        err.print(
            f"{file}: `longhaul plan {file}` shows the memory per GPU and phase; "
            "`longhaul submit` refuses this spec unless --ignore-memory-plan"
        )


def refuse_over_memory(exp: Experiment, file: Path, *, ignore: bool = False) -> None:
    """`submit`: exit 2, with nothing written or submitted, when a phase does not fit (with `ignore`: say so
    and go on)."""
    check = check_memory(exp, file)
    if check.skipped:
        err.print(f"note {file}: memory plan skipped: {check.skipped}")
    for line in check.warnings:
        err.print(f"warning {line}")
    if not check.blocking:
        return
    if ignore:
        for line in check.blocking:
            err.print(f"warning {line}")
        err.print("submitting although the memory plan does not fit (--ignore-memory-plan)")
        return
    for line in check.blocking:
        err.print(f"error {line}")
    err.print(
        f"the memory plan does not fit (`longhaul plan {file}`); nothing was written or submitted. "
        "Pass --ignore-memory-plan to submit anyway."
    )
    raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        file: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (bytes).")] = False,
    ) -> None:
        """Memory per GPU and phase (rollout, weight sync, training, evaluation) against the GPU's capacity.

        Exit 1 when a phase does not fit, 2 when the spec is invalid or a model's shape is unknown."""
        # deferred: the memory plan renders the launch plan (~0.3 s with the spec's models)
        from longhaul.memory import render_memory_plan
        from longhaul.memory.load import UnknownModel, load_memory_plan
        from longhaul.spec import SpecError, load_specs

        try:
            (exp,) = load_specs([file])
        except SpecError as exc:
            fail_on_spec_error(exc)
        try:
            memory = load_memory_plan(exp)
        except UnknownModel as exc:
            err.print(f"error {file}: {exc}")
            raise typer.Exit(2) from None
        if as_json:
            typer.echo(json.dumps(memory.to_dict(), indent=2))
        else:
            typer.echo(render_memory_plan(memory), nl=False)
        if memory.blocking:
            raise typer.Exit(1)
