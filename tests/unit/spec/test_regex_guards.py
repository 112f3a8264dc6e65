"""Every regex guard matches the whole value: Python's `match` with `$` also accepts a trailing newline, which would
then reach object names, labels, run directories and sbatch lines (#30)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longhaul.render.slurm import render_slurm
from support.specs import spec_variant

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["smoke\n", "smoke\n\n", "smoke\r"])
def test_validate_refuses_a_name_with_a_trailing_line_break(tmp_path, name):
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = tmp_path / "nl.yaml"
    spec.write_text(yaml.safe_dump(doc))
    res = subprocess.run(
        [sys.executable, "-m", "longhaul.cli", "validate", str(spec)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode != 0 and "metadata.name" in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def test_an_sbatch_dependency_with_a_trailing_newline_is_refused():
    exp = spec_variant("lata")
    assert "afterok:12" in render_slurm(exp, dependency="afterok:12")
    with pytest.raises(ValueError, match="not an sbatch dependency expression"):
        render_slurm(exp, dependency="afterok:12\n")


def test_a_tool_argument_id_with_a_trailing_newline_is_a_placeholder():
    """PRM-Lite's format check of tool arguments: 'ABC123\\n' is not a reservation id (the seed-compatible mode
    keeps the original's check, which let it by)."""
    from longhaul.rewards.prm_lite import has_placeholder

    assert not has_placeholder({"reservation_id": "ABC123"})
    assert has_placeholder({"reservation_id": "ABC123\n"})
    assert not has_placeholder({"reservation_id": "ABC123\n"}, seed_compat=True)
