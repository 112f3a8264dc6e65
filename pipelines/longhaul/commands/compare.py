"""`longhaul compare`: the ablation table and figures from MLflow."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from longhaul.commands import plain_console

err = plain_console(stderr=True)


def sqlite_store_problem(uri: str) -> str | None:
    """Why a `sqlite:` tracking URI cannot be compared (its store file does not exist: MLflow would create an empty
    database there and compare nothing), else None. Other schemes are left to MLflow."""
    if not uri.startswith("sqlite:"):
        return None
    # sqlite:///relative/path or sqlite:////absolute/path (SQLAlchemy's form, which MLflow takes).
    path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
    if not path or path == ":memory:":
        return f"{uri}: not a store file; pass sqlite:///PATH/mlflow.db (a run directory's store)"
    if not Path(path).is_file():
        return f"{uri}: no MLflow store at {path}; check the path (a run's store is <run dir>/mlflow.db)"
    return None


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        experiments: Annotated[
            list[str] | None,
            typer.Argument(
                help="MLflow experiments: names ('longhaul/lata'), spec families ('lata') or spec files; "
                "none = every experiment with longhaul training runs."
            ),
        ] = None,
        tracking_uri: Annotated[
            str | None,
            typer.Option("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI)."),
        ] = None,
        out_dir: Annotated[Path, typer.Option("--out", help="Directory for the table and figures.")] = Path(
            "comparison"
        ),
        log: Annotated[
            bool, typer.Option("--log/--no-log", help="Log the outputs to MLflow (experiment longhaul/comparisons).")
        ] = True,
    ) -> None:
        """Ablation table (markdown + CSV) and comparison/progression PNGs over evaluated checkpoints, then the
        statistics: rates with CIs per arm and subset, and every pair of arms compared on every subset with a
        verdict (training-seed noise included, Holm-corrected; no verdict with one seed per arm)."""
        # One line per downloaded results file would bury the table.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            err.print(
                "error: no MLflow tracking URI; pass --tracking-uri URI (e.g. http://127.0.0.1:5000 or "
                "sqlite:///runs/<run>/mlflow.db) or export MLFLOW_TRACKING_URI"
            )
            raise typer.Exit(2)
        problem = sqlite_store_problem(uri)
        if problem:
            err.print(f"error --tracking-uri: {problem}")
            raise typer.Exit(2)
        # deferred: mlflow, pandas and matplotlib via longhaul.tracking (~2 s)
        from longhaul.tracking.client import TrackingError
        from longhaul.tracking.compare import write_comparison

        try:
            result = write_comparison(uri, experiments or [], out_dir, log=log)
        except TrackingError as exc:
            err.print(f"error: {exc}")
            raise typer.Exit(1) from exc
        typer.echo(result.markdown, nl=False)
        for f in result.files:
            err.print(f"wrote {f}")
        if result.run_id:
            err.print(f"logged to MLflow run {result.run_id} (experiment longhaul/comparisons)")
