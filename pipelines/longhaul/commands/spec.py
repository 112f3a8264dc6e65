"""Spec commands: validate, render, schema, crd."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console

from longhaul.spec import SpecError, load_specs, run_name

err = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)


def fail_on_spec_error(exc: SpecError) -> None:
    """Print every problem and exit 2 (nothing rendered, written or submitted)."""
    for p in exc.problems:
        err.print(f"[red]error[/red] {p.render()}", markup=True)
    err.print(f"{len(exc.problems)} problem(s); nothing was rendered, written or submitted.")
    raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    @app.command()
    def validate(
        files: Annotated[list[Path], typer.Argument(help="Experiment YAML files.")],
    ) -> None:
        """Validate spec files; report every problem (file:line field: message) at once."""
        try:
            exps = load_specs(list(files))
        except SpecError as exc:
            fail_on_spec_error(exc)
        for f, exp in zip(files, exps, strict=True):
            out.print(f"ok {f} -> run {run_name(exp)}")

    @app.command()
    def schema(
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    ) -> None:
        """Print the JSON schema of an Experiment file."""
        from longhaul.spec.export import build_json_schema

        text = json.dumps(build_json_schema(), indent=2, sort_keys=True) + "\n"
        _emit(text, output)

    @app.command()
    def crd(
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    ) -> None:
        """Print the Experiment CustomResourceDefinition (YAML)."""
        from longhaul.spec.export import build_crd

        _emit(dump_yaml(build_crd()), output)


def dump_yaml(doc: object) -> str:
    """Stable YAML for generated files (no sorting of keys, unicode kept, no line folding)."""
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1_000_000)


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
