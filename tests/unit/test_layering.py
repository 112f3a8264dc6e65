"""Architecture rules enforced by tools, not hope."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pure_core_imports_no_io_modules() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(exe)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "broken" in res.stdout and "0 broken" in res.stdout


def test_no_importable_top_level_operator_package() -> None:
    """`operator/` holds kopf handlers only; a package or module there would shadow the standard library."""
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert not (ROOT / "operator.py").exists()
    assert not list((ROOT / "pipelines").glob("operator*"))
    import operator

    assert Path(operator.__file__).parent != ROOT / "operator"
