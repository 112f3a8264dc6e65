"""`longhaul compare` argument handling that needs no MLflow server."""

from __future__ import annotations

from typer.testing import CliRunner

from longhaul.cli import app


def test_compare_without_a_tracking_uri_says_how_to_give_one(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(app, ["compare", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "--tracking-uri" in res.output and "MLFLOW_TRACKING_URI" in res.output
    assert not any(tmp_path.iterdir())


def test_compare_is_listed_in_help():
    res = CliRunner().invoke(app, ["compare", "--help"])
    assert res.exit_code == 0
    for opt in ("--tracking-uri", "--out", "--no-log"):
        assert opt in res.output
