"""images/flash-attn-wheel.sh run for real on this CPU machine, every step up to the CUDA compile.

flash-attn's setup.py honours FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE (it then declares no extension module and
builds a pure-Python wheel); the recipe passes it through in its CI mode. A temporary stack stands in for
cuda13: the shipped flash-attn pin, Python and torch of this venv (a CPU torch, the same version string that
`make install` installed, fetched into a wheelhouse by pip from the index pip is configured for).

What this proves: the fresh venv (pip only) plus images/flash-attn-build-requirements.txt is everything setup.py
imports; `--no-build-isolation` builds against the venv's torch taken from the wheelhouse alone (`--no-index`);
the sdist comes from the configured index; FLASH_ATTENTION_FORCE_BUILD keeps setup.py from fetching a prebuilt
wheel from GitHub; the wheel's run-time dependencies resolve from the wheelhouse alone; a skip build never lands
beside a wheelhouse; the recipe's refusals (Python version, missing torch wheel) come before any work.

What it does not prove: that flash-attn 2.8.3's CUDA sources compile with CUDA 13.0's nvcc against torch 2.11
(upstream has an open CUDA-13 build report), the compile's time and memory (MAX_JOBS), the archs chosen
(FLASH_ATTN_CUDA_ARCHS), the C++ ABI match with torch's wheel, Python 3.12 on the Ubuntu 24.04 builder, and that
the extension loads and runs on a GPU. Those need the stack's builder image and a GPU.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.images, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "images" / "flash-attn-wheel.sh"
BUILD_REQS = ROOT / "images" / "flash-attn-build-requirements.txt"
TORCH = importlib.metadata.version("torch")
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
FA = re.search(r"^flash-attn==(\S+)", (ROOT / "images/stacks/cuda13/requirements.txt").read_text(), re.M).group(1)


def _stack(tmp: Path, python: str = PY) -> Path:
    stack = tmp / "fa-cpu-probe"
    stack.mkdir()
    (stack / "stack.env").write_text(f"PYTHON_VERSION={python}\n")
    (stack / "requirements.txt").write_text(f"torch=={TORCH}\nflash-attn=={FA}\n")
    (stack / "constraints.txt").write_text(f"torch=={TORCH}\n")
    return stack


def _recipe(stack: Path, out: Path, wheelhouse: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "WHEELHOUSE": str(wheelhouse)}
    env["FLASH_ATTENTION_SKIP_CUDA_BUILD"] = "TRUE"
    return subprocess.run(
        ["bash", str(RECIPE), str(stack), str(out)], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_recipe_runs_every_step_up_to_the_cuda_compile(tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    # what images/wheelhouse.sh would hold for this stand-in stack: torch with its dependencies, and einops
    # (flash-attn's other run-time dependency; vLLM brings it into the cuda13 wheelhouse)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(wheelhouse), f"torch=={TORCH}", "einops"],
        check=True,
        capture_output=True,
    )
    res = _recipe(_stack(tmp_path), tmp_path / "out", wheelhouse)
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    dest = tmp_path / "out" / "skip-cuda-build"
    wheel = dest / f"flash_attn-{FA}-py3-none-any.whl"
    assert wheel.exists(), sorted(p.name for p in dest.iterdir())
    names = zipfile.ZipFile(wheel).namelist()
    assert "flash_attn/__init__.py" in names
    assert not [n for n in names if n.endswith(".so")]  # the one thing a skip build leaves out
    assert not list((tmp_path / "out").glob("*.whl"))  # never where a wheelhouse glob would take it
    # the build venv held exactly the pinned build dependencies and the wheelhouse's torch
    pins = dict(re.findall(r"^([\w-]+)==(\S+)$", BUILD_REQS.read_text(), re.M))
    assert f"build venv: torch {TORCH} (CUDA None), setuptools {pins['setuptools']}," in res.stdout
    for name in ("packaging", "ninja", "psutil"):
        assert f"{name} {pins[name]}" in res.stdout
    log = (dest / f"flash_attn-{FA}-build.log").read_text()
    assert "running bdist_wheel" in log
    assert "Guessing wheel URL" not in log  # FLASH_ATTENTION_FORCE_BUILD: no download of a prebuilt wheel
    assert "CUDA extension skipped" in res.stdout and "next: FLASH_ATTN_WHEEL" not in res.stdout


def test_recipe_refuses_before_any_work(tmp_path: Path) -> None:
    empty = tmp_path / "empty-wheelhouse"
    empty.mkdir()
    res = _recipe(_stack(tmp_path), tmp_path / "out", empty, timeout=60)
    assert res.returncode == 2 and f"no torch-{TORCH} wheel in {empty}" in res.stderr
    other = tmp_path / "other"
    other.mkdir()
    res = _recipe(_stack(other, python="3.12" if PY != "3.12" else "3.11"), tmp_path / "out", empty, timeout=60)
    assert res.returncode == 2 and "the wheel's cpXY tag must match" in res.stderr
    # a skip build refuses to write beside a wheelhouse (images/wheelhouse.sh's marker)
    house = tmp_path / "house"
    house.mkdir()
    (house / f"torch-{TORCH}-cp00-none-any.whl").write_bytes(b"")
    (house / ".wheelhouse-0123456789abcdef").write_text("")
    third = tmp_path / "third"
    third.mkdir()
    res = _recipe(_stack(third), house, house, timeout=60)
    assert res.returncode == 2 and "must not land there" in res.stderr
    assert not (house / "skip-cuda-build").exists()


def test_recipe_names_no_index_host() -> None:
    """The sdist and the build dependencies come from whatever index pip is configured for."""
    for path in (RECIPE, BUILD_REQS):
        text = path.read_text()
        assert "://" not in text and "--index-url" not in text and "pypi.org" not in text, path
