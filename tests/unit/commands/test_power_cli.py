"""`longhaul power`: MDE, power and the design a target effect needs (issue 14, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longhaul import bounded
from longhaul.cli import app
from longhaul.commands.power import parse_effect
from longhaul.eval import stats


def _run(*args: str):
    return CliRunner().invoke(app, ["power", *args])


def test_defaults_are_the_original_ablation():
    res = _run()
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "50 tasks × 4 samples per task × 1 seed per arm" in out
    assert "baseline pass^1 0.175; flip rate 0.160 between runs, 0.160 within a seed" in out
    assert f"MDE          {stats.mde(50, 4, 1) * 100:.1f} points at 80% power" in out
    assert f"{stats.power(0.065, 50, 4, 1):.0%} for +6.5 points" in out
    assert "needs        +6.5 points at 80% power needs 3 seeds per arm at 4 samples per task" in out


def test_json_matches_the_library():
    res = _run("--tasks", "10", "--seeds", "2", "--samples", "8", "--effect", "10", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["design"] == {
        "tasks": 10,
        "samples": 8,
        "seeds": 2,
        "baseline": 0.175,
        "flip_rate": 0.16,
        "within_flip_rate": 0.16,
    }
    assert doc["mde"] == pytest.approx(stats.mde(10, 8, 2))
    assert doc["power"] == pytest.approx(stats.power(0.10, 10, 8, 2))
    need = stats.required_design(0.10, 10, 8, 2)
    assert doc["needs"]["seeds"] == need.seeds and doc["needs"]["samples"] == need.samples
    assert doc["needs"]["text"] == need.describe()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("6.5", 0.065),
        ("6.5pt", 0.065),
        ("6.5 points", 0.065),
        ("6.5%", 0.065),
        ("0.065", 0.065),
        ("-3", -0.03),
        ("0.5pt", 0.005),
    ],
)
def test_effect_is_points_or_a_fraction(text, value):
    assert parse_effect(text) == pytest.approx(value)


def test_effect_as_fraction_and_points_agree():
    a, b = _run("--effect", "0.065", "--json"), _run("--effect", "6.5pt", "--json")
    assert json.loads(a.stdout)["power"] == json.loads(b.stdout)["power"]


def test_bad_effect_and_impossible_flip_rate_exit_2():
    res = _run("--effect", "lots")
    assert res.exit_code == 2 and "--effect: 'lots' is not a number" in res.stderr
    res = _run("--flip-rate", "0.5")
    assert res.exit_code == 2 and "flip_rate must be in [0, 2·b·(1−b)] = [0, 0.289]" in res.stderr


def test_from_comparison_file_and_overrides(tmp_path: Path):
    path = tmp_path / "design.json"
    path.write_text(stats.StudyDesign(50, 4, 2, 0.3, 0.3, 0.24).to_json())
    doc = json.loads(_run("--from-comparison", str(path), "--json").stdout)
    assert doc["design"] == {
        "tasks": 50,
        "samples": 4,
        "seeds": 2,
        "baseline": 0.3,
        "flip_rate": 0.3,
        "within_flip_rate": 0.24,
    }
    assert doc["mde"] == pytest.approx(stats.mde(50, 4, 2, 0.3, 0.3, within_flip_rate=0.24))
    doc = json.loads(_run("--from-comparison", str(path), "--seeds", "5", "--json").stdout)
    assert doc["design"]["seeds"] == 5 and doc["design"]["tasks"] == 50
    # A new between-run flip rate does not keep the file's within-seed one (it may exceed it).
    doc = json.loads(_run("--from-comparison", str(path), "--flip-rate", "0.2", "--json").stdout)
    assert doc["design"]["within_flip_rate"] == 0.2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"tasks": 50, "samples": 4, "seeds": 1, "baseline": 0.175}', "field 'flip_rate' is missing"),
        (
            '{"tasks": 50, "samples": 4, "seeds": 1, "baseline": "high", "flip_rate": 0.16}',
            "field 'baseline': expected a number in [0, 1] (got 'high')",
        ),
        (
            '{"tasks": 50, "samples": 4, "seeds": 1, "baseline": 0.175, "flip_rate": 0.16, "seed": 3}',
            "unknown field 'seed'; valid: tasks, samples, seeds",
        ),
        ('{"tasks": 50,', "design.json:1: not JSON"),
        ("[" * 100 + "]" * 100, "nested deeper than the 64 levels"),
    ],
)
def test_bad_comparison_file_names_file_and_field(tmp_path: Path, content: str, message: str):
    path = tmp_path / "design.json"
    path.write_text(content)
    res = _run("--from-comparison", str(path))
    assert res.exit_code == 2, res.output
    assert str(path) in res.stderr and message in res.stderr, res.stderr


def test_oversized_or_missing_comparison_file_exit_2(tmp_path: Path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (bounded.SMALL_JSON.max_bytes + 1))
    res = _run("--from-comparison", str(big))
    assert res.exit_code == 2 and f"{big}:1: file is larger than the 4 MiB limit" in res.stderr
    res = _run("--from-comparison", str(tmp_path / "nope.json"))
    assert res.exit_code == 2 and "nope.json: cannot read" in res.stderr


def test_listed_in_help():
    res = CliRunner().invoke(app, ["--help"])
    assert "power" in res.stdout
