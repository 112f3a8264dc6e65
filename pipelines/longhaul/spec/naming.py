"""Deterministic names (pure).

`run_name = <metadata.name>-<first 8 hex of sha256(canonical spec)>`. An Experiment with training seeds
(`spec.algorithm.seeds`) is a group of runs: `seed_runs` expands it into one single-seed Experiment per seed,
named `<group run name>-s<seed>`; the group's run name travels in the annotation `longhaul.dev/seed-group`, so a
seed run's resolved spec names itself wherever it is re-read (in the job, by the operator, by `status`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from longhaul.constants import ANNOTATION_SEED_GROUP
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


#: Memo of spec hashes: a render asks for the run name dozens of times and hashing dumps the whole spec.
#: Keyed by object identity; the entry keeps the (frozen) Experiment alive, so an id is never reused.
_HASHES: dict[int, tuple[Experiment, str]] = {}
_HASH_MEMO_SIZE = 256


def spec_hash(exp: Experiment) -> str:
    """Full sha256 hex of the canonical spec (memoised per Experiment object)."""
    hit = _HASHES.get(id(exp))
    if hit is None or hit[0] is not exp:
        if len(_HASHES) >= _HASH_MEMO_SIZE:
            _HASHES.clear()
        hit = (exp, hashlib.sha256(canonical_json(exp).encode("utf-8")).hexdigest())
        _HASHES[id(exp)] = hit
    return hit[1]


def run_name(exp: Experiment) -> str:
    """`<metadata.name>-<8 hex>` (`<group>-s<seed>` for a seed run): Kubernetes objects, the Slurm job, run dirs
    and MLflow runs are named by it."""
    group = seed_group(exp)
    if group is not None:
        return f"{group}-s{exp.spec.algorithm.seed}"
    return f"{exp.metadata.name}-{spec_hash(exp)[:8]}"


def seed_group(exp: Experiment) -> str | None:
    """The run name of the multi-seed Experiment a seed run was expanded from; None for any other run."""
    return exp.metadata.annotations.get(ANNOTATION_SEED_GROUP)


def seed_runs(exp: Experiment) -> list[Experiment]:
    """The runs of an Experiment: itself when it has no `seeds`, else one seed run per seed (in the listed
    order), each a complete single-seed Experiment (`seed` set, `seeds` removed, the group annotation added)."""
    seeds = exp.spec.algorithm.seeds
    if not seeds:
        return [exp]
    group = run_name(exp)
    doc = exp.model_dump(mode="json", exclude_unset=True)
    algorithm = doc.setdefault("spec", {}).setdefault("algorithm", {})
    algorithm.pop("seeds", None)
    doc.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_SEED_GROUP] = group
    out = []
    for s in seeds:
        algorithm["seed"] = s
        out.append(Experiment.model_validate(doc))
    return out


def group_of(seed_run: Experiment, seeds: list[int]) -> Experiment | None:
    """The multi-seed Experiment with `seeds` (in that order) that `seed_run` is one run of — the inverse of
    `seed_runs`; None when `seed_run` is no seed run, its seed is not in `seeds` or the seeds do not validate."""
    if seed_group(seed_run) is None or seed_run.spec.algorithm.seed not in seeds:
        return None
    doc = seed_run.model_dump(mode="json", exclude_unset=True)
    algorithm = doc["spec"]["algorithm"]
    algorithm.pop("seed", None)
    algorithm["seeds"] = list(seeds)
    annotations = doc["metadata"]["annotations"]
    del annotations[ANNOTATION_SEED_GROUP]
    if not annotations:
        del doc["metadata"]["annotations"]
    try:
        return Experiment.model_validate(doc)
    except ValueError:
        return None


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
