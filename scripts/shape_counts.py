#!/usr/bin/env python3
"""Print the shape of the source tree: long modules, long functions and function-level imports.

Issue #32 item 5 asks that functions read as recipes of named steps (none over 100 lines) and that modules stay
under about 400 lines; an import inside a function body often hides a cycle. This script measures all three with
the standard library's `ast` only, so it runs anywhere without the project installed:

    python scripts/shape_counts.py [ROOT ...]      # default: pipelines/longhaul

Lines are physical lines (a function counts from its `def` to its last line, decorators excluded).

A function-level import is *justified* when it defers a heavy or optional dependency and says so (issue #32 item
2): a `# deferred: <why>` comment on its first line, in the comment lines right above it, or above the first of
the import statements it directly follows (no blank line between: one comment covers a block). Every other
function-level import is *unjustified*; `tests/unit/test_import_discipline.py` fails on any (`unjustified`).
"""

from __future__ import annotations

import argparse
import ast
import re
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
#: The reason comment of a deferred import: `# deferred: <why>` (the why is not empty).
DEFERRED = re.compile(r"#\s*deferred:\s*\S")
_COMMENT_LINE = re.compile(r"^\s*#")


@dataclass(frozen=True)
class FunctionImport:
    """An import statement inside a function body."""

    lineno: int
    text: str
    justified: bool


@dataclass(frozen=True)
class Shape:
    """What one module contributes to the report."""

    path: Path
    lines: int
    long_functions: tuple[tuple[str, int], ...]
    imports: tuple[FunctionImport, ...]

    @property
    def function_imports(self) -> int:
        """How many import statements sit inside a function body."""
        return len(self.imports)

    @property
    def unjustified(self) -> tuple[FunctionImport, ...]:
        """The function-level imports without a `# deferred:` reason."""
        return tuple(i for i in self.imports if not i.justified)


def _walk_scopes(node: ast.AST, prefix: str, in_function: bool) -> Iterator[tuple[ast.AST, str, bool]]:
    """Yield (node, qualified name of its enclosing scope, whether that scope is inside a function) for every node."""
    for child in ast.iter_child_nodes(node):
        yield child, prefix, in_function
        if isinstance(child, (*_FUNCTIONS, ast.ClassDef)):
            name = f"{prefix}.{child.name}" if prefix else child.name
            yield from _walk_scopes(child, name, in_function or isinstance(child, _FUNCTIONS))
        else:
            yield from _walk_scopes(child, prefix, in_function)


def _has_reason(lines: list[str], lineno: int) -> bool:
    """Whether line `lineno` (1-based) or the comment lines right above it carry a `# deferred:` reason."""
    if DEFERRED.search(lines[lineno - 1]):
        return True
    i = lineno - 2
    while i >= 0 and _COMMENT_LINE.match(lines[i]):
        if DEFERRED.search(lines[i]):
            return True
        i -= 1
    return False


def _previous_statements(tree: ast.AST) -> dict[ast.stmt, ast.stmt]:
    """Each statement's previous sibling in the same block (body, else, finally, handler)."""
    previous: dict[ast.stmt, ast.stmt] = {}
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                for before, after in zip(block, block[1:], strict=False):
                    previous[after] = before
    return previous


def measure(path: Path) -> Shape:
    """Measure one Python file."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    previous = _previous_statements(tree)
    long_functions: list[tuple[str, int]] = []
    justified: dict[ast.stmt, bool] = {}
    for node, prefix, in_function in _walk_scopes(tree, "", False):
        if isinstance(node, _FUNCTIONS):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LIMIT:
                long_functions.append((f"{prefix}.{node.name}" if prefix else node.name, length))
        elif isinstance(node, _IMPORTS) and in_function:
            before = previous.get(node)
            follows = isinstance(before, _IMPORTS) and before.end_lineno == node.lineno - 1
            justified[node] = _has_reason(lines, node.lineno) or (follows and justified.get(before, False))
    imports = tuple(
        FunctionImport(n.lineno, " ".join(lines[n.lineno - 1 : n.end_lineno]).split("#")[0].strip(), ok)
        for n, ok in sorted(justified.items(), key=lambda item: item[0].lineno)
    )
    return Shape(path, len(text.splitlines()), tuple(long_functions), imports)


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
    unjustified: Counter[str] = Counter()
    for root, s in shapes:
        if s.function_imports:
            per_package[_package_of(s.path, root)] += s.function_imports
            unjustified[_package_of(s.path, root)] += len(s.unjustified)
    out.append("function-level imports by package (justified = `# deferred:` reason given):")
    out.append("  total  justified  unjustified  package")
    for package, count in sorted(per_package.items(), key=lambda pc: (-pc[1], pc[0])):
        bad = unjustified[package]
        out.append(f"  {count:5d}  {count - bad:9d}  {bad:11d}  {package}")
    total, bad = sum(per_package.values()), sum(unjustified.values())
    out.append(f"  {total:5d}  {total - bad:9d}  {bad:11d}  total")
    out.append("unjustified function-level imports:")
    for _root, s in shapes:
        for imp in s.unjustified:
            out.append(f"  {_display(s.path)}:{imp.lineno}: {imp.text}")
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
