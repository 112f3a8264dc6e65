#!/usr/bin/env python3
"""Print the shape of the source tree: long modules, long functions and function-level imports.

Issue #32 item 5 asks that functions read as recipes of named steps (none over 100 lines) and that modules stay
under about 400 lines; an import inside a function body often hides a cycle. This script measures all three with
the standard library's `ast` only, so it runs anywhere without the project installed:

    python scripts/shape_counts.py [ROOT ...]      # default: pipelines/longhaul

Lines are physical lines (a function counts from its `def` to its last line, decorators excluded).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO / "pipelines" / "longhaul"
MODULE_LIMIT = 400
FUNCTION_LIMIT = 100

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_IMPORTS = (ast.Import, ast.ImportFrom)


@dataclass(frozen=True)
class Shape:
    """What one module contributes to the report."""

    path: Path
    lines: int
    long_functions: tuple[tuple[str, int], ...]
    function_imports: int


def _walk_scopes(node: ast.AST, prefix: str, in_function: bool) -> Iterator[tuple[ast.AST, str, bool]]:
    """Yield (node, qualified name of its enclosing scope, whether that scope is inside a function) for every node."""
    for child in ast.iter_child_nodes(node):
        yield child, prefix, in_function
        if isinstance(child, (*_FUNCTIONS, ast.ClassDef)):
            name = f"{prefix}.{child.name}" if prefix else child.name
            yield from _walk_scopes(child, name, in_function or isinstance(child, _FUNCTIONS))
        else:
            yield from _walk_scopes(child, prefix, in_function)


def measure(path: Path) -> Shape:
    """Measure one Python file."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    long_functions: list[tuple[str, int]] = []
    function_imports = 0
    for node, prefix, in_function in _walk_scopes(tree, "", False):
        if isinstance(node, _FUNCTIONS):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LIMIT:
                long_functions.append((f"{prefix}.{node.name}" if prefix else node.name, length))
        elif isinstance(node, _IMPORTS) and in_function:
            function_imports += 1
    return Shape(path, len(text.splitlines()), tuple(long_functions), function_imports)


def _package_of(path: Path, root: Path) -> str:
    """The first directory under `root` (or the module itself for a top-level module)."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def report(roots: list[Path]) -> str:
    """The three tables as text."""
    shapes = [(root, measure(p)) for root in roots for p in sorted(root.rglob("*.py"))]
    out: list[str] = [f"modules over {MODULE_LIMIT} lines:"]
    for _root, s in sorted(shapes, key=lambda rs: -rs[1].lines):
        if s.lines > MODULE_LIMIT:
            out.append(f"  {s.lines:5d}  {_display(s.path)}")
    out.append(f"functions over {FUNCTION_LIMIT} lines:")
    functions = [(n, name, s.path) for _root, s in shapes for name, n in s.long_functions]
    for n, name, path in sorted(functions, key=lambda f: -f[0]):
        out.append(f"  {n:5d}  {_display(path)}:{name}")
    per_package: Counter[str] = Counter()
    for root, s in shapes:
        if s.function_imports:
            per_package[_package_of(s.path, root)] += s.function_imports
    out.append("function-level imports by package:")
    for package, count in sorted(per_package.items(), key=lambda pc: (-pc[1], pc[0])):
        out.append(f"  {count:5d}  {package}")
    out.append(f"  {sum(per_package.values()):5d}  total")
    return "\n".join(out)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the report for the given roots."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", type=Path, default=[DEFAULT_ROOT])
    args = parser.parse_args(argv)
    print(report([root.resolve() for root in args.roots]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
