"""Names of a run's Kubernetes objects (pure): `<run>-spec` for its ConfigMap, `<run>-<stage>` for each stage
workload, derived from `run_name(exp)` only, so a re-render after an operator restart yields the same names."""

from __future__ import annotations

from longhaul.spec.models import Experiment, Stage
from longhaul.spec.naming import run_name

#: Kubernetes label values and Job names (the Job controller copies them into a label) are ≤ 63 characters.
MAX_NAME = 63


def child_name(exp: Experiment, suffix: str) -> str:
    """`<run>-<suffix>`, shortening the experiment name (never the hash or seed) to stay within 63 characters."""
    tail = run_name(exp)[len(exp.metadata.name) :]  # "-<8 hex>" or "-<8 hex>-s<seed>"
    room = MAX_NAME - len(tail) - len(suffix) - 1
    base = exp.metadata.name[:room].rstrip("-")
    return f"{base}{tail}-{suffix}"


def configmap_name(exp: Experiment) -> str:
    """The run's spec ConfigMap, `<run>-spec`."""
    return child_name(exp, "spec")


def stage_job_name(exp: Experiment, stage: Stage | str) -> str:
    """The workload of one stage, `<run>-<stage>`."""
    return child_name(exp, str(stage))
