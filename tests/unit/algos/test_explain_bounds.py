"""`longhaul explain` reads through `longhaul.bounded.TRAJECTORIES` (a JSON document or JSON Lines)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longhaul import bounded
from longhaul.cli import app


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, "t.json: nested deeper than the 64 levels allowed in a trajectory file"),
        ("[" + ", ".join(["{}"] * 6) + "]", "t.json: 6 records, over the 5 limit of a trajectory file"),
        ("{}\n" * 6, "t.json:6: more than 5 records"),
        ('{"turns": []}\n' + '{"a": ' * 70 + "1" + "}" * 70 + "\n", "t.json:2 a.a.a"),
        ('{"turns": []}\n{"turns": [}\n', "t.json:2: not JSON"),
    ],
)
def test_explain_refuses_hostile_trajectory_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, needle: str
) -> None:
    monkeypatch.setattr(bounded, "TRAJECTORIES", dataclasses.replace(bounded.TRAJECTORIES, max_records=5))
    f = tmp_path / "t.json"
    f.write_text(text)
    res = CliRunner().invoke(app, ["explain", str(f)])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output
