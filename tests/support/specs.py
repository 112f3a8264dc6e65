"""Variants of the shipped specs for tests: `spec_variant("lata", resources__nodes=2)`."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from longhaul.spec.models import Experiment

SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"


def spec_variant(stem: str, **changes: object) -> Experiment:
    """`specs/<stem>.yaml` with `spec` fields replaced; keys are paths under `spec` joined by `__`."""
    doc = yaml.safe_load((SPECS_DIR / f"{stem}.yaml").read_text(encoding="utf-8"))
    for dotted, value in changes.items():
        node = doc["spec"]
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = copy.deepcopy(value)
    return Experiment.model_validate(doc)
