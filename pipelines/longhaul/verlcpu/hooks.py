"""Run a function on a module when it is first imported (or now, if it already is).

The CPU platform's rollout patches change modules that only the rollout processes import (veRL's vLLM server and
vLLM's engine workers). Importing them eagerly in every veRL process would cost each one vLLM's import time, so
the patch waits for the module: a `sys.meta_path` finder wraps the module's loader and calls the function right
after the module's code has run, before anyone can use it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_PENDING: dict[str, list[Callable[[ModuleType], None]]] = {}


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the rest of `sys.meta_path` and wraps the loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _PENDING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            for fn in _PENDING.pop(fullname, []):
                fn(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterImportFinder()


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call `fn(module)` once `name` is imported: now if it already is, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    _PENDING.setdefault(name, []).append(fn)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
