"""Function-level imports only where a heavy or optional dependency is deferred, each saying why (issue #32 item 2).

An import inside a function body hides what a module needs and can hide an import cycle (import-linter's
`acyclic_siblings` contracts see them and keep the packages acyclic). One is allowed where it keeps a heavy or
optional dependency (torch, transformers, mlflow, ray, veRL, vLLM, pyarrow/pandas, httpx, the spec's pydantic models
for `longhaul --help`, …) off the paths that do not use it, with a `# deferred: <why>` comment on its line or the
comment lines above it (one comment may head a block of adjacent imports). The rule and the counting live in
`scripts/shape_counts.py`, which prints the same counts.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipelines" / "longhaul"


def _shape_counts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("longhaul_shape_counts", ROOT / "scripts" / "shape_counts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_every_function_level_import_says_why_it_is_deferred() -> None:
    shapes = _shape_counts()
    unjustified = [
        f"{path.relative_to(ROOT)}:{imp.lineno}: {imp.text}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for imp in shapes.measure(path).unjustified
    ]
    assert not unjustified, (
        "function-level imports without a `# deferred: <why>` comment (move them to the module top, or say which "
        "heavy or optional dependency they defer, on the import's line or the line above):\n" + "\n".join(unjustified)
    )


def test_the_rule_reads_the_comment_on_the_line_the_line_above_or_the_head_of_a_block(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        "import os\n"
        "\n"
        "\n"
        "def f():\n"
        "    import torch  # deferred: torch (~1 s)\n"
        "    # deferred: mlflow (~1 s)\n"
        "    import mlflow\n"
        "    import mlflow.entities\n"
        "\n"
        "    import json\n"
        "    # a comment that gives no reason\n"
        "    import re\n"
        "    # deferred:\n"
        "    import csv\n"
        "    return os, torch, mlflow, json, re, csv\n",
        encoding="utf-8",
    )
    imports = _shape_counts().measure(source).imports
    assert [(i.lineno, i.justified) for i in imports] == [
        (5, True),
        (7, True),
        (8, True),  # directly below a justified import: the block's comment covers it
        (10, False),  # a blank line ends the block
        (12, False),
        (14, False),  # a reason must follow `deferred:`
    ]
