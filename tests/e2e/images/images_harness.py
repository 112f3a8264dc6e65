"""Shared helpers and session fixtures of the image tests: the local Debian base, the two image builds
(recorded in build/images-timings.json), and `podman run` with no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BASE = "localhost/longhaul-base:bookworm"
#: The CI trainer stack: the project + huggingface_hub, every Dockerfile stage and instruction, a small wheelhouse.
STACK = "cpu-min"
TRAINER = "localhost/longhaul-trainer:ci"
OPERATOR = "localhost/longhaul-operator:ci"
BAKED_REPO = "longhaul-ci/tiny-policy"
BAKED_USER = "longhaul-ci/tiny-user"
MODELS_DIR = "build/models-ci"
TIMINGS = ROOT / "build" / "images-timings.json"


def sh(*argv: str, timeout: float = 120, check: bool = False, **kw) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} -> {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def record(name: str, seconds: float) -> None:
    data = json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}
    data[name] = round(seconds, 1)
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps(data, indent=2, sort_keys=True))


@pytest.fixture(scope="session")
def podman() -> str:
    exe = shutil.which("podman")
    if exe is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("image tests need root and podman in CI: run scripts/ci/images-setup.sh first")
        pytest.skip("needs root and podman (scripts/ci/images-setup.sh)")
    return exe


@pytest.fixture(scope="session")
def base_image(podman: str) -> str:
    t0 = time.monotonic()
    sh("bash", "images/debian-base.sh", BASE, timeout=900, check=True)
    record("debian_base_s", time.monotonic() - t0)
    return BASE


def build(target: str, *assignments: str) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "ENGINE": "podman"}
    t0 = time.monotonic()
    sh("bash", "images/build.sh", target, *assignments, timeout=1800, check=True, env=env)
    record(f"build_{target}_s", time.monotonic() - t0)


@pytest.fixture(scope="session")
def trainer(base_image: str) -> str:
    shutil.rmtree(ROOT / MODELS_DIR, ignore_errors=True)
    for repo in (BAKED_REPO, BAKED_USER):
        sh(sys.executable, "images/tiny-model.py", MODELS_DIR, repo, check=True)
    build(
        "trainer",
        f"STACK={STACK}",
        f"BUILDER_IMAGE={base_image}",
        f"BASE_IMAGE={base_image}",
        "MODEL_SRC=local",
        f"LOCAL_MODELS={MODELS_DIR}",
        f"IMAGE={TRAINER}",
    )
    return TRAINER


@pytest.fixture(scope="session")
def operator_image(base_image: str) -> str:
    build("operator", f"BUILDER_IMAGE={base_image}", f"BASE_IMAGE={base_image}", f"IMAGE={OPERATOR}")
    return OPERATOR


def run(image: str, *args: str, opts: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`podman run` with no network at all."""
    return sh("podman", "run", "--rm", "--network", "none", *opts, image, *args, timeout=timeout)


def inspect(image: str) -> dict:
    return json.loads(sh("podman", "image", "inspect", image, check=True).stdout)[0]


def write_spec(path: Path, policy: str, simulator: str) -> Path:
    path.write_text(
        "apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: baked}\nspec:\n"
        f"  policy: {{model: {{name: {policy}}}}}\n  user_simulator: {{model: {{name: {simulator}}}}}\n"
    )
    path.chmod(0o644)
    return path


@pytest.fixture
def specs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "specs"
    d.mkdir()
    d.chmod(0o755)
    write_spec(d / "baked.yaml", BAKED_REPO, BAKED_USER)
    write_spec(d / "unbaked.yaml", BAKED_REPO, "Qwen/Qwen2.5-72B-Instruct-AWQ")
    return d


def mount(d: Path, target: str = "/specs") -> tuple[str, ...]:
    return ("-v", f"{d}:{target}:ro")
