"""`longhaul power`: MDE, power and the design a target effect needs, for the verdict's rule with training-seed
noise (issue 14 item 4, issue 29 items 2, 3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longhaul import bounded
from longhaul.cli import app
from longhaul.commands.power import parse_effect
from longhaul.eval import stats


def _run(*args: str):
    return CliRunner().invoke(app, ["power", *args])


def test_defaults_are_the_original_ablation_and_one_seed_gives_no_verdict():
    res = _run()
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "50 tasks × 4 samples per task × 1 seed per arm" in out
    assert (
        "baseline pass^1 0.175; flip rate 0.160 between runs, 0.160 within a seed; seed SD 2.4 points "
        "(default: an assumed modest seed effect)" in out
    )
    assert "rule         one seed per arm: no verdict" in out
    assert "MDE          none with one seed per arm" in out and "power        0% for +6.5 points" in out
    need = stats.required_design(0.065, 50, 4, 1)
    assert f"needs        +6.5 points at 80% power needs {need.seeds} seeds per arm at 4 samples per task" in out
    # The noise line splits the SD of the difference into its task part (2.8 points, the original's) and seeds.
    assert "SD of the difference 4.4 points (tasks 2.8, whole seeds 3.4)" in out


def test_seeds_give_the_rules_mde_and_power():
    res = _run("--seeds", "3")
    assert res.exit_code == 0, res.output
    assert f"MDE          {stats.mde(50, 4, 3) * 100:.1f} points at 80% power" in res.stdout
    assert f"power        {stats.power(0.065, 50, 4, 3):.0%} for +6.5 points" in res.stdout
    assert "(seed variance measured from the seeds, 4 df)" in res.stdout and "p < α = 0.05" in res.stdout


def test_json_matches_the_library():
    res = _run("--tasks", "10", "--seeds", "5", "--samples", "8", "--effect", "10", "--seed-sd", "1.5", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["design"] == {
        "tasks": 10,
        "samples": 8,
        "seeds": 5,
        "baseline": 0.175,
        "flip_rate": 0.16,
        "within_flip_rate": 0.16,
        "seed_sd": 0.015,
        "comparisons": 1,
    }
    assert doc["mde"] == pytest.approx(stats.mde(10, 8, 5, seed_sd=0.015))
    assert doc["power"] == pytest.approx(stats.power(0.10, 10, 8, 5, seed_sd=0.015))
    need = stats.required_design(0.10, 10, 8, 5, seed_sd=0.015)
    assert doc["needs"]["seeds"] == need.seeds and doc["needs"]["samples"] == need.samples
    assert doc["needs"]["text"] == need.describe()
    assert doc["noise_sd_seeds"] == pytest.approx(math.sqrt(2 * 0.015**2 / 5))


def test_a_family_of_verdicts_is_powered_at_alpha_over_its_size():
    one = json.loads(_run("--seeds", "3", "--json").stdout)
    three = json.loads(_run("--seeds", "3", "--comparisons", "3", "--json").stdout)
    assert three["alpha_per_comparison"] == pytest.approx(0.05 / 3)
    assert three["mde"] == pytest.approx(stats.mde(50, 4, 3, alpha=0.05 / 3)) and three["mde"] > one["mde"]
    res = _run("--seeds", "3", "--comparisons", "3")
    assert "p < α/3 = 0.0167 (Holm over 3)" in res.stdout


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


def test_bad_effect_impossible_flip_rate_and_bad_family_exit_2():
    res = _run("--effect", "lots")
    assert res.exit_code == 2 and "--effect: 'lots' is not a number" in res.stderr
    res = _run("--flip-rate", "0.5")
    assert res.exit_code == 2 and "flip_rate must be in [0, 2·b·(1−b)] = [0, 0.289]" in res.stderr
    res = _run("--seed-sd", "70")
    assert res.exit_code == 2 and "seed_sd must be in [0, 0.5]" in res.stderr
    res = _run("--comparisons", "0")
    assert res.exit_code == 2 and "--comparisons must be ≥ 1 (got 0)" in res.stderr


def test_from_comparison_file_and_overrides(tmp_path: Path):
    path = tmp_path / "design.json"
    path.write_text(stats.StudyDesign(50, 4, 2, 0.3, 0.3, 0.24, 0.01, 3).to_json())
    doc = json.loads(_run("--from-comparison", str(path), "--json").stdout)
    assert doc["design"] == {
        "tasks": 50,
        "samples": 4,
        "seeds": 2,
        "baseline": 0.3,
        "flip_rate": 0.3,
        "within_flip_rate": 0.24,
        "seed_sd": 0.01,
        "comparisons": 3,
    }
    assert doc["mde"] == pytest.approx(stats.mde(50, 4, 2, 0.3, 0.3, 0.05 / 3, within_flip_rate=0.24, seed_sd=0.01))
    assert "seed SD 1.0 points (measured)" in _run("--from-comparison", str(path)).stdout
    assert (
        json.loads(_run("--from-comparison", str(path), "--seed-sd", "2", "--json").stdout)["design"]["seed_sd"] == 0.02
    )
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
