"""Every `LONGHAUL_*` environment variable is named once, in `longhaul.constants`, and imported from there.

The scan reads the source of pipelines/longhaul and operator/ with `ast` and fails on any string literal (f-string
parts included) holding a `LONGHAUL_` name outside constants.py. Docstrings and comments may name variables: they
are prose for readers (a comment is not in the syntax tree at all), and a docstring cannot take an f-string.
Messages that name a variable interpolate the constant (`f"set {C.ENV_KUBECTL}"`), so a rename reaches them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from longhaul import constants as C

ROOT = Path(__file__).resolve().parents[2]
CONSTANTS = ROOT / "pipelines" / "longhaul" / "constants.py"
NAME = re.compile(r"LONGHAUL_\w*")


def _sources() -> list[Path]:
    files = sorted((ROOT / "pipelines" / "longhaul").rglob("*.py")) + sorted((ROOT / "operator").rglob("*.py"))
    return [f for f in files if f != CONSTANTS]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                out.add(id(first.value))
    return out


def find_env_literals(source: str, filename: str = "<source>") -> list[str]:
    """`file:line: 'text'` for every non-docstring string literal that holds a `LONGHAUL_` name."""
    tree = ast.parse(source, filename)
    docs = _docstrings(tree)
    return [
        f"{filename}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and NAME.search(node.value)
    ]


def test_no_longhaul_variable_named_outside_constants() -> None:
    sources = _sources()
    assert len(sources) > 50 and any(f.parent.name == "operator" for f in sources)
    found = [hit for f in sources for hit in find_env_literals(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))]
    assert not found, (
        "name these variables in pipelines/longhaul/constants.py and import them "
        "(`from longhaul import constants as C`):\n" + "\n".join(found)
    )


def test_the_scan_sees_literals_and_f_string_parts_but_not_docstrings_or_comments() -> None:
    src = '''"""Module docs: $LONGHAUL_A."""
import os
# a comment about LONGHAUL_B
def f():
    """Reads LONGHAUL_C."""
    x = os.environ.get("LONGHAUL_D")
    return f"set LONGHAUL_E to {x}", "LONGHAUL_"
'''
    hits = find_env_literals(src)
    assert sorted(h.split(": ", 1)[1] for h in hits) == ["'LONGHAUL_'", "'LONGHAUL_D'", "'set LONGHAUL_E to '"]


def test_each_variable_has_one_constant_and_one_prefix() -> None:
    env = {k: v for k, v in vars(C).items() if k.startswith("ENV_") and isinstance(v, str)}
    assert len(env) > 20
    assert all(v.startswith("LONGHAUL_") and v == v.upper() for v in env.values()), env
    dupes = sorted(v for v in env.values() if list(env.values()).count(v) > 1)
    assert not dupes, f"two constants name the same variable: {dupes}"
    # The two pairs that once disagreed: the launcher's names are the only ones.
    assert C.ENV_POLICY_BASE_URL == "LONGHAUL_POLICY_BASE_URL"
    assert C.ENV_USER_SIM_API_KEY == "LONGHAUL_USER_SIM_API_KEY"
    assert "LONGHAUL_POLICY_URL" not in env.values() and "LONGHAUL_USER_API_KEY" not in env.values()
