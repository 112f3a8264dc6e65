"""Evaluation summary (nested dict from `longhaul.eval`) → flat MLflow metric keys (pure).

Shape accepted — `longhaul.eval.metrics.compute_summary`'s document; every part optional, extra numeric
fields are kept, strings and other lists (`per_task`, `k`) stay in `summary.json` only:

    {"tasks": 50, "trials": 400,
     "pass_hat_k": {"1": 0.41, "2": 0.30}, "pass_at_k": {"1": 0.41, "4": 0.66},
     "ci": {"pass_hat_k": {"1": [0.33, 0.49]}},   # [lo, hi] pairs under `ci` become …/lo and …/hi
     "tool_error_rate": 0.05, "abort_rate": 0.02,
     "subsets": {"train": {"pass_hat_k": {...}, ...}, "test": {...}},
     "generalisation_pass_hat_1": 0.12, "terminations": {"user_stop": 301, ...}}

gives `eval/pass_hat_k/1`, `eval/ci/pass_hat_k/1/lo`, `eval/train/pass_hat_k/1`, `eval/generalisation_pass_hat_1`.
Wrapper keys `overall` and `metrics` are transparent; `subsets`/`per_subset` children sit directly under
`eval/`. MLflow forbids `^` in keys: `pass^k` becomes `pass_hat_k`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

EVAL_PREFIX = "eval"
_TRANSPARENT = frozenset({"overall", "metrics"})
_SUBSET_BLOCKS = frozenset({"subsets", "per_subset", "by_subset"})
_INVALID = re.compile(r"[^/\w.\- :]")


def sanitize_key(key: str) -> str:
    """An MLflow-valid metric key segment: `^` → `_hat_`, `@` → `_at_`, other invalid characters → `_`."""
    return _INVALID.sub("_", str(key).replace("^", "_hat_").replace("@", "_at_")).strip("/") or "_"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))


def build_eval_metrics(summary: Mapping[str, Any], prefix: str = EVAL_PREFIX) -> dict[str, float]:
    """Flatten an evaluation summary into `{metric key: value}` (see module docstring)."""
    out: dict[str, float] = {}

    def walk(node: Any, path: tuple[str, ...], top: bool) -> None:
        if _is_number(node):
            out["/".join((prefix, *path))] = float(node)
        elif isinstance(node, Mapping):
            for k, v in node.items():
                k = str(k)
                if top and k in _TRANSPARENT:
                    walk(v, path, top=True)
                elif top and k in _SUBSET_BLOCKS and isinstance(v, Mapping):
                    for subset, block in v.items():
                        walk(block, (*path, sanitize_key(subset)), top=False)
                else:
                    walk(v, (*path, sanitize_key(k)), top=False)
        elif "ci" in path and isinstance(node, list | tuple) and len(node) == 2 and all(map(_is_number, node)):
            out["/".join((prefix, *path, "lo"))] = float(node[0])
            out["/".join((prefix, *path, "hi"))] = float(node[1])

    walk(summary, (), top=True)
    return out


def headline_key(measure: str = "pass_hat_k", k: int = 1, subset: str | None = None) -> str:
    """The metric key of one headline number, e.g. `eval/test/pass_hat_k/1`."""
    parts = [EVAL_PREFIX] + ([sanitize_key(subset)] if subset else []) + [measure, str(k)]
    return "/".join(parts)
