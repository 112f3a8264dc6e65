"""The Experiment spec: models, loading with precise errors, deterministic naming, schema/CRD export."""

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
