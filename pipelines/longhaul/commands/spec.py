"""Spec commands: validate, render, schema, crd."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml

from longhaul.commands import check_run_dir, fail_on_spec_error, plain_console
from longhaul.commands.plan import warn_memory
from longhaul.files import PLAIN, atomic_write_text

err = plain_console(stderr=True)
out = plain_console()


def register(app: typer.Typer) -> None:
    @app.command()
    def validate(
        files: Annotated[list[Path], typer.Argument(help="Experiment YAML files.")],
    ) -> None:
        """Validate spec files; report every problem (file:line field: message) at once."""
        # deferred: the spec's pydantic models (~0.2 s); --help loads no command's dependencies
        from longhaul.spec import SpecError, load_specs, run_name

        try:
            exps = load_specs(list(files))
        except SpecError as exc:
            fail_on_spec_error(exc)
        for f, exp in zip(files, exps, strict=True):
            out.print(f"ok {f} -> run {run_name(exp)}")
            warn_memory(exp, f)

    @app.command()
    def render(
        file: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
        backend: Annotated[str, typer.Option("--backend", "-b", help="kubernetes | slurm | verl | local")] = "local",
        out: Annotated[Path | None, typer.Option("--out", help="Write the rendered files into this directory.")] = None,
        run_dir: Annotated[
            str | None, typer.Option("--run-dir", help="Run directory (verl/local).", callback=check_run_dir)
        ] = None,
    ) -> None:
        """Render a spec for a backend (a pure dry run): print it, or write it with --out."""
        # deferred: the renderers and the spec's pydantic models (~0.3 s)
        from longhaul.render import BACKENDS
        from longhaul.render import render as render_spec
        from longhaul.spec import SpecError, load_specs

        if backend not in BACKENDS:
            err.print(f"error --backend: unknown '{backend}'; valid: {', '.join(BACKENDS)}")
            raise typer.Exit(2)
        if out is not None and out.exists() and not out.is_dir():
            err.print(f"error --out: {out} is a file; give a directory (it is created if missing)")
            raise typer.Exit(2)
        try:
            (exp,) = load_specs([file])
        except SpecError as exc:
            fail_on_spec_error(exc)
        try:
            rendered = render_spec(exp, backend, run_dir=run_dir)
        except ValueError as exc:
            err.print(f"error {file}: cannot render for {backend}: {exc}")
            raise typer.Exit(2) from None
        if out is None:
            typer.echo(rendered.text(), nl=False)
            return
        out.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.files.items():
            atomic_write_text(out / name, text, mode=PLAIN)
            err.print(f"wrote {out / name}")

    @app.command()
    def schema(
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    ) -> None:
        """Print the JSON schema of an Experiment file."""
        from longhaul.spec.export import build_json_schema  # deferred: the spec's pydantic models (~0.2 s)

        text = json.dumps(build_json_schema(), indent=2, sort_keys=True) + "\n"
        _emit(text, output)

    @app.command()
    def crd(
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    ) -> None:
        """Print the Experiment CustomResourceDefinition (YAML)."""
        from longhaul.spec.export import build_crd  # deferred: the spec's pydantic models (~0.2 s)

        _emit(dump_yaml(build_crd()), output)


def dump_yaml(doc: object) -> str:
    """Stable YAML for generated files (no sorting of keys, unicode kept, no line folding)."""
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1_000_000)


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        typer.echo(text, nl=False)
    else:
        atomic_write_text(output, text, mode=PLAIN)
