"""Golden sbatch scripts for the variants the per-spec goldens (tests/golden/<spec>/slurm.sbatch) do not cover:
multi-node Ray on each container runtime and on veRL's CPU platform, a single-stage script with a dependency,
and the job array of a spec with training seeds.

`LONGHAUL_UPDATE_GOLDEN=1 pytest tests/unit/slurm` regenerates; review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from longhaul.render.slurm import render_slurm
from longhaul.spec.models import Experiment
from support.specs import spec_variant

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests/golden/slurm"
UPDATE = os.environ.get("LONGHAUL_UPDATE_GOLDEN") == "1"


def _smoke_with_seeds(seeds: list[int]) -> Experiment:
    """specs/smoke.yaml with `seeds` instead of its `seed` (spec_variant can set fields, not remove one)."""
    exp = spec_variant("smoke")
    doc = exp.model_dump(mode="json", exclude_unset=True)
    doc["spec"]["algorithm"].pop("seed")
    doc["spec"]["algorithm"]["seeds"] = seeds
    return Experiment.model_validate(doc)


CASES = {
    "lata-nodes2-apptainer": lambda: render_slurm(
        spec_variant(
            "lata",
            resources__nodes=2,
            backends__slurm={
                "partition": "gpu",
                "account": "proj",
                "setup": ["module load cuda/12.4"],
                "container": {
                    "runtime": "apptainer",
                    "image": "/shared/images/longhaul-0.1.0.sif",
                    "binds": ["/shared/hf"],
                },
            },
        )
    ),
    "lata-nodes2-pyxis": lambda: render_slurm(
        spec_variant(
            "lata",
            resources__nodes=2,
            backends__slurm={"container": {"runtime": "pyxis", "image": "ghcr.io/longhaul-dev/trainer+0.1.0"}},
        )
    ),
    "lata-nodes2-venv": lambda: render_slurm(
        spec_variant(
            "lata",
            resources__nodes=2,
            backends__slurm={"container": {"runtime": "none"}, "venv": "/shared/venvs/longhaul"},
        )
    ),
    # veRL's CPU platform across 2 nodes (the CI cluster's partition `multi`): one logical "GPU" per node.
    "smoke-nodes2-cpu": lambda: render_slurm(
        spec_variant(
            "smoke",
            stages=["grpo"],
            resources__nodes=2,
            algorithm__ppo_micro_batch_size_per_gpu=2,
            backends__slurm={"partition": "multi", "container": {"runtime": "none"}},
        )
    ),
    "smoke-eval-after": lambda: render_slurm(spec_variant("smoke"), stage="eval", dependency="afterok:1234"),
    "smoke-seeds": lambda: render_slurm(_smoke_with_seeds([7, 8])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    text = CASES[name]()
    path = GOLDEN / f"{name}.sbatch"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; run LONGHAUL_UPDATE_GOLDEN=1 pytest tests/unit/slurm"
    assert text == path.read_text(encoding="utf-8"), f"{path} differs; regenerate and review the diff"
