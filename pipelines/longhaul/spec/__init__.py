"""The Experiment spec: models, loading with precise errors, deterministic naming, schema/CRD export.

The names below are loaded on first use (PEP 562): importing a leaf of the spec (`longhaul.spec.bounds`,
`longhaul.spec.paths`) does not build every model of the schema (~0.2 s), so `longhaul --help` stays quick. The
`TYPE_CHECKING` imports are the same edges for type checkers and import-linter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from longhaul.spec.load import Problem, SpecError, build_experiment, load_spec, load_specs, parse_spec_text
    from longhaul.spec.models import Experiment, resolved_yaml
    from longhaul.spec.naming import (
        canonical_json,
        experiment_family,
        run_name,
        seed_group,
        seed_runs,
        spec_hash,
    )

#: Each exported name and the module that defines it.
_EXPORTS = {
    "Problem": "longhaul.spec.load",
    "SpecError": "longhaul.spec.load",
    "build_experiment": "longhaul.spec.load",
    "load_spec": "longhaul.spec.load",
    "load_specs": "longhaul.spec.load",
    "parse_spec_text": "longhaul.spec.load",
    "Experiment": "longhaul.spec.models",
    "resolved_yaml": "longhaul.spec.models",
    "canonical_json": "longhaul.spec.naming",
    "experiment_family": "longhaul.spec.naming",
    "run_name": "longhaul.spec.naming",
    "seed_group": "longhaul.spec.naming",
    "seed_runs": "longhaul.spec.naming",
    "spec_hash": "longhaul.spec.naming",
}

__all__ = [
    "Experiment",
    "Problem",
    "SpecError",
    "build_experiment",
    "canonical_json",
    "experiment_family",
    "load_spec",
    "load_specs",
    "parse_spec_text",
    "resolved_yaml",
    "run_name",
    "seed_group",
    "seed_runs",
    "spec_hash",
]


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module on first use and kept here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
