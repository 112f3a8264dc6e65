"""Every shipped spec's rendered script (and the variants the renderer supports) is accepted by the real sbatch."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from longhaul.render.slurm import render_slurm
from longhaul.spec import load_spec
from support.specs import spec_variant

REPO = Path(__file__).resolve().parents[3]
SPECS = sorted((REPO / "specs").glob("*.yaml"))

pytestmark = pytest.mark.slurm


def _test_only(script: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sbatch"
    path.write_text(script, encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # Command-line options override #SBATCH lines; `extra` only ever narrows the node count.
    return subprocess.run(
        ["sbatch", "--test-only", *extra, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_every_spec_passes_sbatch_test_only(slurm_cluster, spec: Path, tmp_path: Path) -> None:
    proc = _test_only(render_slurm(load_spec(spec)), tmp_path)
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr


VARIANTS = {
    "partition": dict(backends__slurm__partition="debug"),
    "apptainer": dict(backends__slurm__container={"runtime": "apptainer", "image": "/sif/l.sif", "binds": ["/data"]}),
    "pyxis": dict(backends__slurm__container={"runtime": "pyxis", "image": "nvcr.io/org/longhaul+0.1"}),
    "no_requeue": dict(backends__slurm__requeue=False),
    "setup": dict(backends__slurm__setup=["module load cuda/12.4 || true", "echo 'site setup'"]),
    "untyped_gpus": dict(resources__gpu_type=None),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_pass_sbatch_test_only(slurm_cluster, name: str, tmp_path: Path) -> None:
    proc = _test_only(render_slurm(spec_variant("lata", **VARIANTS[name])), tmp_path)
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr


def test_multi_node_script_is_accepted_with_the_node_count_narrowed(slurm_cluster, tmp_path: Path) -> None:
    exp = spec_variant("lata", resources__nodes=2)
    script = render_slurm(exp)
    assert _test_only(script, tmp_path).returncode != 0  # the CI cluster has one node: 2 cannot be satisfied
    proc = _test_only(script, tmp_path, "--nodes=1")
    assert proc.returncode == 0 and "to start at" in proc.stderr, proc.stderr


def test_stage_with_dependency_on_a_real_job(slurm_cluster, tmp_path: Path) -> None:
    first = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    try:
        proc = _test_only(
            render_slurm(load_spec(REPO / "specs/smoke.yaml"), stage="eval", dependency=f"afterok:{first}"), tmp_path
        )
        assert proc.returncode == 0, proc.stderr
    finally:
        subprocess.run(["scancel", first], timeout=30)


def test_impossible_requests_are_rejected(slurm_cluster, tmp_path: Path) -> None:
    """The check can fail: a GPU type or partition the cluster lacks is refused by sbatch."""
    for changes in (dict(resources__gpu_type="h100"), dict(backends__slurm__partition="nosuchpart")):
        proc = _test_only(render_slurm(spec_variant("lata", **changes)), tmp_path)
        assert proc.returncode != 0, (changes, proc.stderr)
