"""Run commands: submit, status, logs (backend adapters in `longhaul.submit.<backend>`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from longhaul.spec import SpecError, load_spec
from longhaul.submit import BACKENDS, BackendUnavailable, backend_of_run, get_backend

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

DEFAULT_RUNS_DIR = "runs"


def _fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error[/red] {message}", markup=True)
    raise typer.Exit(code)


def resolve_run_dir(run: str) -> Path:
    """RUN may be a run directory, a run name under ./runs/, or a spec file (its Slurm/local run directory)."""
    path = Path(run)
    if path.is_dir():
        return path
    if path.suffix in (".yaml", ".yml") and path.is_file():
        from longhaul.render.slurm import slurm_run_dir

        try:
            exp = load_spec(path)
        except SpecError as exc:
            from longhaul.commands.spec import fail_on_spec_error

            fail_on_spec_error(exc)
        local = Path(exp.spec.backends.local.output_dir) / Path(slurm_run_dir(exp)).name
        for cand in (Path(slurm_run_dir(exp)), local):
            if (cand / "submit.json").is_file():
                return cand
        _fail(f"{run}: this spec has not been submitted from here (no {slurm_run_dir(exp)}/submit.json)")
    cand = Path(DEFAULT_RUNS_DIR) / run
    if cand.is_dir():
        return cand
    _fail(f"{run}: not a run directory, a run name under ./{DEFAULT_RUNS_DIR}/, or a spec file")
    raise AssertionError  # unreachable


def register(app: typer.Typer) -> None:
    @app.command()
    def submit(
        spec: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
        backend: Annotated[str, typer.Option("--backend", "-b", help=f"One of: {', '.join(BACKENDS)}.")],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be submitted; run nothing.")] = False,
        ignore_memory_plan: Annotated[bool, typer.Option(
            "--ignore-memory-plan", help="Submit even when `longhaul plan` finds a phase over GPU capacity.")] = False,
    ) -> None:
        """Render SPEC for BACKEND and submit it (the same spec resumes the same run)."""
        try:
            exp = load_spec(spec)
        except SpecError as exc:
            from longhaul.commands.spec import fail_on_spec_error

            fail_on_spec_error(exc)
        from longhaul.commands.plan import refuse_over_memory

        refuse_over_memory(exp, spec, ignore=ignore_memory_plan)
        try:
            mod = get_backend(backend, need=("submit_run",))
            result = mod.submit_run(exp, dry_run=dry_run)
        except BackendUnavailable as exc:
            _fail(str(exc), 2)
        except (RuntimeError, ValueError, OSError) as exc:
            _fail(f"{spec}: {backend} submission failed: {exc}; nothing further was submitted")
        if dry_run:
            typer.echo(result.script, nl=False)
            err.print(result.message)
            return
        typer.echo(result.job_id or "")
        err.print(result.message)

    @app.command()
    def status(
        run: Annotated[str, typer.Argument(help="Run directory, run name (under ./runs) or spec file.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """Phase of a submitted run (Pending, Running, Succeeded, Failed) with the backend's own state."""
        run_dir = resolve_run_dir(run)
        try:
            mod = get_backend(backend_of_run(run_dir), need=("fetch_status",))
            st = mod.fetch_status(run_dir)
        except BackendUnavailable as exc:
            _fail(str(exc), 2)
        except (RuntimeError, OSError) as exc:
            _fail(f"{run_dir}: {exc}")
        if as_json:
            typer.echo(json.dumps(st, indent=2, default=str))
            return
        job = st.get("job") or {}
        line = f"{st.get('run_name')}  phase={job.get('phase', '?')}  state={job.get('state', '?')}"
        for key, label in (("job_id", "job"), ("reason", "reason"), ("restarts", "restarts"), ("exit_code", "exit")):
            if job.get(key) not in (None, "", 0):
                line += f"  {label}={job[key]}"
        if st.get("checkpoint_step") is not None:
            line += f"  checkpoint_step={st['checkpoint_step']}"
        if st.get("stages_done"):
            line += f"  stages_done={','.join(st['stages_done'])}"
        out.print(line)

    @app.command()
    def logs(
        run: Annotated[str, typer.Argument(help="Run directory, run name (under ./runs) or spec file.")],
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    ) -> None:
        """Print the job log of a submitted run (all requeued runs of the job are in one file)."""
        run_dir = resolve_run_dir(run)
        try:
            mod = get_backend(backend_of_run(run_dir), need=("fetch_logs",))
            for chunk in mod.fetch_logs(run_dir, follow=follow):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except BackendUnavailable as exc:
            _fail(str(exc), 2)
        except (RuntimeError, OSError) as exc:
            _fail(f"{run_dir}: {exc}")
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
