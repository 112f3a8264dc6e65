"""`longhaul run` (local backend) and `longhaul launch` (the in-job launcher)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from longhaul.commands import check_run_dir


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        spec: Annotated[Path, typer.Argument(help="Experiment YAML, e.g. specs/smoke.yaml.")],
        stage: Annotated[str | None, typer.Option("--stage", help="Run only this stage (sft, grpo, eval).")] = None,
        run_dir: Annotated[
            Path | None,
            typer.Option("--run-dir", help="Default: <backends.local.output_dir>/<run name>.", callback=check_run_dir),
        ] = None,
    ) -> None:
        """Run SPEC on this machine (local backend): servers, training, evaluation, MLflow; one seed run after another
        when the spec lists training seeds; the same spec resumes."""
        # deferred: the local backend's HTTP clients and the spec's pydantic models (~0.4 s)
        from longhaul.spec import SpecError, load_spec
        from longhaul.submit.local import run_local_seeds

        try:
            exp = load_spec(spec)
            results = run_local_seeds(exp, run_dir=run_dir, stage=stage)
        except SpecError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
        except ValueError as exc:
            typer.echo(f"error: {spec}: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(results[-1][1])

    @app.command("launch")
    def launch_cmd(
        spec: Annotated[Path, typer.Option("--spec", help="The mounted resolved spec (re-validated).")],
        backend: Annotated[str, typer.Option("--backend", help="kubernetes, slurm or local.")],
        run_dir: Annotated[
            Path, typer.Option("--run-dir", help="The run directory (checkpoints, logs, eval).", callback=check_run_dir)
        ],
        stage: Annotated[str | None, typer.Option("--stage", help="Run only this stage.")] = None,
    ) -> None:
        """The in-job launcher: start servers, wait for health, run the stages, stop cleanly.

        Exit codes: 0 done; 75 checkpoint saved after SIGUSR1 (requeue me); 143/130 stopped by SIGTERM/Ctrl-C;
        1 a stage or server failed; 2 invalid spec.
        """
        from longhaul.launcher.supervisor import launch  # deferred: the launcher, httpx and the spec's models (~0.4 s)

        raise typer.Exit(launch(spec, backend, run_dir, stage=stage))
