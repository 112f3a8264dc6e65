"""Deterministic names (pure).

`run_name = <metadata.name>-<first 8 hex of sha256(canonical spec)>`. An Experiment with training seeds
(`spec.algorithm.seeds`) is a group of runs: `seed_runs` expands it into one single-seed Experiment per seed,
named `<group run name>-s<seed>`. A seed run carries the group's seeds in the annotation
`longhaul.dev/seed-group-seeds`, from which the group's spec — and so its run name, hash included — is rebuilt
(`seed_group`): a seed run's resolved spec names itself wherever it is re-read (in the job, by the operator, by
`status`), and the name always derives from the spec. The group's run name also travels in the annotation
`longhaul.dev/seed-group`; it is checked against the rebuilt name (`seed_group_problem`), never trusted: a
hand-written one cannot attach a spec to another run's directory, MLflow run or checkpoints.

The hashed document itself (`canonical_document`) lives with the `Experiment` (`longhaul.spec.models`), whose
validator measures the resolved form built from it.
"""

from __future__ import annotations

import hashlib
import json

from longhaul.constants import ANNOTATION_SEED_GROUP, ANNOTATION_SEED_GROUP_SEEDS
from longhaul.spec.models import Experiment, canonical_document
from longhaul.spec.seeds import parse_seed_list


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


#: Memo of seed groups (rebuilding a group validates a whole Experiment), keyed like `_HASHES`.
_GROUPS: dict[int, tuple[Experiment, str | None]] = {}


def seed_group(exp: Experiment) -> str | None:
    """The run name of the multi-seed Experiment a seed run was expanded from, derived from the seed run's spec
    and the group's seeds (`group_of`); None for any other run, and for a spec whose annotations do not rebuild a
    group (`load_spec` refuses it: `seed_group_problem`)."""
    hit = _GROUPS.get(id(exp))
    if hit is None or hit[0] is not exp:
        seeds = exp.metadata.annotations.get(ANNOTATION_SEED_GROUP_SEEDS)
        group = group_of(exp, parse_seed_list(seeds)) if seeds is not None else None
        if len(_GROUPS) >= _HASH_MEMO_SIZE:
            _GROUPS.clear()
        hit = (exp, None if group is None else run_name(group))
        _GROUPS[id(exp)] = hit
    return hit[1]


def seed_group_problem(exp: Experiment) -> str | None:
    """Why the seed-group annotations of `exp` do not hold (None: they do, or there are none): they must rebuild a
    multi-seed Experiment whose run name is the one `longhaul.dev/seed-group` states."""
    stated = exp.metadata.annotations.get(ANNOTATION_SEED_GROUP)
    if stated is None:
        return None
    derived = seed_group(exp)
    if derived == stated:
        return None
    return (
        f"annotation {ANNOTATION_SEED_GROUP}: {stated!r} is not the run name of this spec's seed group "
        f"({derived or 'none: the spec and its seeds annotation rebuild no valid group'}); longhaul sets it, "
        f"with {ANNOTATION_SEED_GROUP_SEEDS}, when it expands spec.algorithm.seeds, and the name derives from the "
        "spec: remove both annotations (an edited spec is a new run)"
    )


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
    annotations = doc.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[ANNOTATION_SEED_GROUP] = group
    annotations[ANNOTATION_SEED_GROUP_SEEDS] = ",".join(str(s) for s in seeds)
    out = []
    for s in seeds:
        algorithm["seed"] = s
        out.append(Experiment.model_validate(doc))
    return out


def group_of(seed_run: Experiment, seeds: list[int]) -> Experiment | None:
    """The multi-seed Experiment with `seeds` (in that order) that `seed_run` is one run of — the inverse of
    `seed_runs`; None when `seed_run` is no seed run, its seed is not in `seeds` or the seeds do not validate."""
    annotations = seed_run.metadata.annotations
    if ANNOTATION_SEED_GROUP not in annotations or seed_run.spec.algorithm.seed not in seeds:
        return None
    doc = seed_run.model_dump(mode="json", exclude_unset=True)
    algorithm = doc["spec"]["algorithm"]
    algorithm.pop("seed", None)
    algorithm["seeds"] = list(seeds)
    annotations = doc["metadata"]["annotations"]
    del annotations[ANNOTATION_SEED_GROUP]
    annotations.pop(ANNOTATION_SEED_GROUP_SEEDS, None)
    if not annotations:
        del doc["metadata"]["annotations"]
    try:
        return Experiment.model_validate(doc)
    except ValueError:
        return None


def experiment_family(exp: Experiment) -> str:
    """MLflow experiment name: the spec's `tracking.experiment` or `longhaul/<metadata.name>`."""
    return exp.spec.tracking.experiment or f"longhaul/{exp.metadata.name}"
