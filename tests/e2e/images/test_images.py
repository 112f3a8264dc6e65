"""Real builds of the real Dockerfiles, then the images run with no network (marker `images`).

CI cannot pull the CUDA bases or reach the Hugging Face Hub, so the trainer is built with the same Dockerfile
and these build arguments substituted: a Debian bookworm base made locally (images/debian-base.sh), STACK=cpu-min
(the project + huggingface_hub; no torch/veRL/vLLM) and MODEL_SRC=local with a tiny Llama model written by
images/tiny-model.py as the baked model. Needs root, podman and mmdebstrap (scripts/ci/images-setup.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from images_harness import BAKED_REPO, BAKED_USER, ROOT, inspect, mount, record, run, sh, write_spec

from longhaul.constants import OFFLINE_ENV

pytestmark = [pytest.mark.images, pytest.mark.slow]


# --------------------------------------------------------------------------------------------------------
# Trainer


def test_trainer_config_non_root_offline_launcher(trainer: str) -> None:
    cfg = inspect(trainer)["Config"]
    assert cfg["User"] == "1000:1000"
    assert cfg["Entrypoint"] + cfg["Cmd"] == ["longhaul", "launch"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert {k: env.get(k) for k in OFFLINE_ENV} == OFFLINE_ENV
    assert env["HF_HOME"] == "/models/hf"


def test_trainer_starts_as_uid_1000_and_cli_runs_offline(trainer: str) -> None:
    ident = run(trainer, "-c", "import os; print(os.getuid(), os.getgid())", opts=("--entrypoint", "python3"))
    assert ident.returncode == 0, ident.stderr
    assert ident.stdout.split() == ["1000", "1000"]
    helped = run(trainer, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "validate" in helped.stdout and "models" in helped.stdout


def test_trainer_resolves_baked_model_offline(trainer: str, specs_dir: Path) -> None:
    res = run(trainer, "models", "check", "/specs/baked.yaml", opts=mount(specs_dir))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok /specs/baked.yaml") == 2
    for repo in (BAKED_REPO, BAKED_USER):
        assert f"/models/hf/hub/models--{repo.replace('/', '--')}/snapshots/" in res.stdout


def test_trainer_fails_fast_and_clearly_on_unbaked_model(trainer: str, specs_dir: Path) -> None:
    res = run(trainer, "models", "check", "/specs/unbaked.yaml", opts=mount(specs_dir), timeout=60)
    assert res.returncode == 1
    assert "spec.user_simulator.model.name: model 'Qwen/Qwen2.5-72B-Instruct-AWQ'" in res.stderr
    assert "is not baked" in res.stderr and "SIMULATOR_MODEL=" in res.stderr
    assert "1 model(s) missing" in res.stderr


def test_trainer_validates_shipped_specs(trainer: str) -> None:
    files = sorted(p.name for p in (ROOT / "specs").glob("*.yaml"))
    res = run(trainer, "validate", *[f"/specs/{f}" for f in files], opts=mount(ROOT / "specs"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("ok /specs/") == len(files)


def test_trainer_runs_as_any_uid_with_read_only_root(trainer: str, specs_dir: Path) -> None:
    # Apptainer/Charliecloud ignore USER and run as the caller; Kubernetes may set readOnlyRootFilesystem.
    opts = (
        "--user",
        "4242:4242",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs",
        "/scratch",
        *mount(specs_dir),
    )
    res = run(trainer, "models", "check", "/specs/baked.yaml", opts=opts)
    assert res.returncode == 0, res.stdout + res.stderr


def test_trainer_dependencies_are_consistent(trainer: str) -> None:
    res = run(trainer, "check", opts=("--entrypoint", "pip"))
    assert res.returncode == 0, res.stdout + res.stderr
    installed = run(trainer, "list", "--format", "json", opts=("--entrypoint", "pip"))
    names = {d["name"].lower().replace("_", "-") for d in json.loads(installed.stdout)}
    assert {"longhaul", "huggingface-hub"} <= names
    assert not names & {"vllm", "autoawq"}, "no vLLM on CPU stacks; no autoawq anywhere"
    assert not names & {"torch", "verl"}, "cpu-min carries no ML stack"


def test_trainer_compiles_at_run_time_like_triton(trainer: str) -> None:
    """What Triton, vLLM and torch.compile build on first use can be built in the image: as the image's user,
    offline, a C extension is compiled against Python.h with Triton's compiler search and flags and imported."""
    probe = (Path(__file__).with_name("jit_probe.py")).read_text(encoding="utf-8")
    res = sh("podman", "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", trainer, "-",
             input=probe, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("answer 42"), res.stdout


def test_trainer_exports_docker_archive_for_apptainer(trainer: str, tmp_path: Path) -> None:
    out = tmp_path / "trainer.tar"
    t0 = time.monotonic()
    sh("bash", "images/build.sh", "export", trainer, str(out), check=True, timeout=600)
    record("export_trainer_s", time.monotonic() - t0)
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest[0]["RepoTags"] == [trainer]
    assert len(manifest[0]["Layers"]) >= 3


def test_trainer_runs_unprivileged_read_only_like_hpc(trainer: str) -> None:
    """Charliecloud's ch-run as `nobody` from a tree it cannot write: no root, no writable /, USER ignored —
    the way Apptainer runs the image on a Slurm cluster (Apptainer itself is not in Debian 12)."""
    ch_run = shutil.which("ch-run")
    if ch_run is None:
        pytest.skip("ch-run (Debian charliecloud-runtime) not installed")
    # pytest's tmp_path is private to root (0700); `nobody` must be able to traverse to the image tree.
    work = Path(tempfile.mkdtemp(prefix="longhaul-chrun-", dir="/var/tmp"))
    try:
        work.chmod(0o755)
        root, specs = work / "rootfs", work / "specs"
        root.mkdir(mode=0o755)
        specs.mkdir(mode=0o755)
        write_spec(specs / "baked.yaml", BAKED_REPO, BAKED_USER)
        cid = sh("podman", "create", trainer, check=True).stdout.strip()
        try:
            tar = subprocess.run(["podman", "export", cid], capture_output=True, timeout=300, check=True).stdout
        finally:
            sh("podman", "rm", cid)
        subprocess.run(["tar", "-x", "-C", str(root), "--exclude=dev/*"], input=tar, check=True)
        (root / "specs").mkdir(exist_ok=True)
        env = [f"--set-env={k}={v}" for k, v in (e.split("=", 1) for e in inspect(trainer)["Config"]["Env"])]
        argv = [ch_run, "--unset-env=*", *env, "-b", f"{specs}:/specs", "--cd=/", str(root), "--"]
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        cmd = [*as_nobody, *argv, "longhaul", "models", "check", "/specs/baked.yaml"]
        env_nobody = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": "nobody", "HOME": "/tmp"}
        res = sh(*cmd, timeout=120, env=env_nobody)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "ok /specs/baked.yaml policy" in res.stdout
        whoami = sh(*as_nobody, *argv, "python3", "-c", "import os; print(os.getuid())", env=env_nobody)
        assert whoami.stdout.strip() != "1000" and whoami.stdout.strip() != "0", whoami
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------
# Operator


def test_operator_non_root_without_ml_stack(operator_image: str) -> None:
    cfg = inspect(operator_image)["Config"]
    assert cfg["User"] == "1000:1000"
    assert cfg["Entrypoint"] == ["kopf", "run"] and cfg["Cmd"][-1].endswith("/longhaul_operator.py")
    probe = (
        "import importlib.util as u; print([m for m in ('torch', 'verl', 'vllm', 'transformers') if u.find_spec(m)])"
    )
    res = run(operator_image, "-c", probe, opts=("--entrypoint", "python3"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_operator_loads_handlers_with_read_only_root(operator_image: str) -> None:
    load = (
        "import importlib.util as u, os; "
        "s = u.spec_from_file_location('h', '/opt/longhaul/operator/longhaul_operator.py'); "
        "m = u.module_from_spec(s); s.loader.exec_module(m); print(os.getuid(), 'handlers loaded')"
    )
    opts = ("--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp", "--entrypoint", "python3")
    res = run(operator_image, "-c", load, opts=opts)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1000 handlers loaded"
    version = run(operator_image, "--version", opts=("--read-only", "--entrypoint", "kopf"))
    assert version.returncode == 0 and "kopf" in version.stdout
    deps = run(operator_image, "-m", "pip", "check", opts=("--entrypoint", "python3"))
    assert deps.returncode == 0, deps.stdout + deps.stderr
