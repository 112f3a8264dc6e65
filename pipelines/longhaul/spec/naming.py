"""Deterministic names: `run_name = <metadata.name>-<first 8 hex of sha256(canonical spec)>` (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from longhaul.spec.models import Experiment


def canonical_document(exp: Experiment) -> dict[str, Any]:
    """The resolved resource that defines a run: apiVersion, kind, metadata.name and the spec with defaults.

    Labels, annotations and namespace are left out on purpose: GitOps tooling may change them without
    making a new run.
    """
    return {
        "apiVersion": exp.apiVersion,
        "kind": exp.kind,
        "metadata": {"name": exp.metadata.name},
        "spec": exp.spec.model_dump(mode="json"),
    }


def canonical_json(exp: Experiment) -> str:
    """Compact, key-sorted JSON of `canonical_document` (the input of the spec hash)."""
    return json.dumps(canonical_document(exp), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def spec_hash(exp: Experiment) -> str:
    """Full sha256 hex of the canonical spec."""
    return hashlib.sha256(canonical_json(exp).encode("utf-8")).hexdigest()


def run_name(exp: Experiment) -> str:
    """`<metadata.name>-<8 hex>`: used for Kubernetes objects, the Slurm job, run dirs and MLflow runs."""
    return f"{exp.metadata.name}-{spec_hash(exp)[:8]}"


def experiment_family(exp: Experiment) -> str:
    """MLflow experiment name: the spec's `tracking.experiment` or `longhaul/<metadata.name>`."""
    return exp.spec.tracking.experiment or f"longhaul/{exp.metadata.name}"


def resolved_yaml(exp: Experiment) -> str:
    """The resolved spec (all defaults filled) as YAML: what jobs mount and re-validate."""
    import yaml

    doc = canonical_document(exp)
    meta = exp.metadata.model_dump(mode="json", exclude_defaults=True)
    doc["metadata"] = meta
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
