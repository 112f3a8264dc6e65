"""The helper scripts of the image builds: argument checks of bake-models.sh, the tiny model's file format, the
project requirements extracted from pyproject.toml, and the wheelhouse's stack check."""

from __future__ import annotations

import json
import runpy
import struct
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def bash(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/tmp/hf", "Qwen/Qwen2.5-7B-Instruct", "main"], "is not a 40-hex commit"),
        (
            ["/tmp/hf", "Qwen/Qwen2.5-7B-Instruct", "A09A35458C702B33EEACC393D103063234E8BC28"],
            "is not a 40-hex",
        ),
        (["/tmp/hf", "Qwen/Qwen2.5-7B-Instruct"], "usage: bake-models.sh"),
        (["/tmp/hf", "a/b", "0" * 40, "c/d"], "usage: bake-models.sh"),
    ],
)
def test_bake_models_refuses_unpinned_or_malformed_arguments(args: list[str], message: str) -> None:
    res = bash("images/bake-models.sh", *args)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_tiny_model_is_a_valid_safetensors_llama(tmp_path: Path) -> None:
    mod = runpy.run_path(str(ROOT / "images" / "tiny-model.py"))
    snap = mod["write_model"](tmp_path, "org/tiny")
    entry = tmp_path / "hf" / "hub" / "models--org--tiny"
    assert (entry / "refs" / "main").read_text() == snap.name and len(snap.name) == 40
    cfg = json.loads((snap / "config.json").read_text())
    data = (snap / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__")
    end = 0
    for _name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        start, stop = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        assert start == end and stop - start == 4 * count and t["dtype"] == "F32"
        end = stop
    assert 8 + n + end == len(data)
    assert header["model.embed_tokens.weight"]["shape"] == [cfg["vocab_size"], cfg["hidden_size"]]
    assert sum(k.startswith("model.layers.") for k in header) == 9 * cfg["num_hidden_layers"]
    # Deterministic: the same bytes (and commit) every time.
    assert mod["write_model"](tmp_path / "again", "org/tiny").name == snap.name


def test_project_requirements_match_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    script = str(ROOT / "images" / "project-requirements.py")
    res = subprocess.run(
        [sys.executable, script, str(ROOT / "pyproject.toml"), "--extras", "operator"],
        capture_output=True,
        text=True,
        check=True,
    )
    expected = project["dependencies"] + project["optional-dependencies"]["operator"]
    assert res.stdout.splitlines() == expected
    bad = subprocess.run(
        [sys.executable, script, str(ROOT / "pyproject.toml"), "--extras", "nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown extra 'nope'" in bad.stderr and "operator" in bad.stderr


def test_wheelhouse_and_build_refuse_unknown_stack(tmp_path: Path) -> None:
    res = bash("images/wheelhouse.sh", "cuda11", str(tmp_path))
    assert res.returncode == 2 and "unknown stack 'cuda11'" in res.stderr and "cuda13" in res.stderr
    res = bash("images/build.sh", "trainer", "STACK=rocm")
    assert res.returncode == 2 and "unknown STACK 'rocm'" in res.stderr
