"""Experiment status from the state of its stage workloads (pure: dicts in, dicts out; time is an argument).

The operator reads the Experiment and its children, calls `build_status`, writes the result to the status
subresource and creates `next_stage` when the previous stages succeeded. A multi-seed Experiment has one stage
chain per seed run: `build_status` per seed run, `seed_run_entry` of each, `build_group_status` over them.
Everything here is deterministic and unit-tested without a cluster.

The phase of each workload and Kueue's word on a queued one are in `longhaul.k8s.workloads`, the conditions in
`longhaul.k8s.conditions`, `status.history` in `longhaul.k8s.history`; this module is the status's one surface
and exports their names too (`__all__`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longhaul import constants as C
from longhaul.k8s.conditions import (
    COND_COMPLETE,
    COND_FAILED,
    COND_QUEUED,
    COND_RUNNING,
    COND_SPEC_CHANGE_REFUSED,
    COND_VALID,
    phase_conditions,
    queued_condition,
    set_condition,
)
from longhaul.k8s.history import HISTORY_LIMIT, record_history, supersede_history
from longhaul.k8s.workloads import (
    ACTIVE,
    KUEUE_INADMISSIBLE,
    SUSPENDED,
    TERMINAL,
    Admission,
    Phase,
    kueue_admission,
    true_condition,
    workload_message,
    workload_phase,
)

__all__ = [
    "ACTIVE",
    "COND_COMPLETE",
    "COND_FAILED",
    "COND_QUEUED",
    "COND_RUNNING",
    "COND_SPEC_CHANGE_REFUSED",
    "COND_VALID",
    "HISTORY_LIMIT",
    "KUEUE_INADMISSIBLE",
    "SEED_RUN_KEYS",
    "SUSPENDED",
    "TERMINAL",
    "Admission",
    "Phase",
    "Reconciled",
    "StageView",
    "build_group_status",
    "build_status",
    "clear_refusal",
    "group_phase",
    "invalid_status",
    "kueue_admission",
    "record_history",
    "refused_status",
    "seed_run_entry",
    "set_condition",
    "supersede_history",
    "workload_message",
    "workload_phase",
]


@dataclass(frozen=True)
class StageView:
    """One stage and its workload as read from the cluster (None = not created yet)."""

    stage: str
    name: str
    workload: dict[str, Any] | None
    #: When the workload is Queued: what Kueue says about it (`kueue_admission`), else None.
    admission: Admission | None = None


@dataclass(frozen=True)
class Reconciled:
    """What the operator should write and do next."""

    status: dict[str, Any]
    next_stage: str | None


def _annotation(stages: list[StageView], key: str) -> str | None:
    # The latest stage that reports a value wins (eval reports after grpo).
    for view in reversed(stages):
        value = (((view.workload or {}).get("metadata") or {}).get("annotations") or {}).get(key)
        if value:
            return value
    return None


def build_status(
    previous: dict[str, Any] | None,
    stages: list[StageView],
    *,
    run_name: str,
    spec_hash: str,
    generation: int | None,
    now: str,
) -> Reconciled:
    """The Experiment status for a valid spec whose stage workloads are `stages` (in order)."""
    prev = dict(previous or {})
    conditions = list(prev.get("conditions") or [])
    conditions = set_condition(
        conditions, COND_VALID, True, "SpecValid", "the spec passed validation", now=now, generation=generation
    )
    phase, current, message, next_stage = _stage_progress(stages)
    conditions = phase_conditions(
        conditions, phase, message, ("AllStagesSucceeded", "StageFailed"), now=now, generation=generation
    )
    conditions = queued_condition(conditions, phase, current.admission, message, now=now, generation=generation)

    status: dict[str, Any] = {
        "phase": phase.value,
        "observedGeneration": generation,
        "runName": run_name,
        "specHash": spec_hash,
        "stage": current.stage,
        "jobName": current.name,
        "message": message,
        "conditions": conditions,
    }
    first = stages[0].workload
    start = ((first or {}).get("status") or {}).get("startTime") or prev.get("startTime")
    if phase != Phase.PENDING and not start:
        start = now
    if start:
        status["startTime"] = start
    if phase in TERMINAL:
        last_status = (current.workload or {}).get("status") or {}
        status["completionTime"] = prev.get("completionTime") or last_status.get("completionTime") or now
    status.update(_run_annotations(prev, stages))
    if generation is None:
        status.pop("observedGeneration")
    return Reconciled(status=status, next_stage=next_stage)


def _stage_progress(stages: list[StageView]) -> tuple[Phase, StageView, str, str | None]:
    """(phase, the stage it is about, message, the stage to create next): the first failed stage fails the run;
    otherwise the run is where its first unfinished stage is, and a stage whose workload does not exist yet, after
    stages that all succeeded, is the next to create."""
    phases = [workload_phase(v.workload) for v in stages]
    next_stage: str | None = None
    current = stages[0]
    for view, phase in zip(stages, phases, strict=True):
        current = view
        if view.workload is None:
            next_stage = view.stage
            break
        if phase != Phase.SUCCEEDED:
            break

    if any(p == Phase.FAILED for p in phases):
        failed = next(v for v, p in zip(stages, phases, strict=True) if p == Phase.FAILED)
        detail = workload_message(failed.workload)
        message = f"stage {failed.stage} (job {failed.name}) failed" + (f": {detail}" if detail else "")
        return Phase.FAILED, failed, message, None
    if all(p == Phase.SUCCEEDED for p in phases) and all(v.workload is not None for v in stages):
        return Phase.SUCCEEDED, stages[-1], f"all stages succeeded: {', '.join(v.stage for v in stages)}", next_stage
    if any(p == Phase.RUNNING for p in phases):
        return Phase.RUNNING, current, f"stage {current.stage} is running (job {current.name})", next_stage
    if any(p == Phase.QUEUED for p in phases):
        admission = current.admission or SUSPENDED
        message = f"stage {current.stage} is queued (job {current.name}): {admission.message}"
        return Phase.QUEUED, current, message, next_stage
    return Phase.PENDING, current, f"stage {current.stage} is waiting to start (job {current.name})", next_stage


def _run_annotations(prev: dict[str, Any], stages: list[StageView]) -> dict[str, Any]:
    """The MLflow run and the last checkpoint the workloads annotate. Kept from the previous status when no
    workload reports them (yet) again: a run that is preempted and resumes keeps its MLflow run and checkpoint."""
    out: dict[str, Any] = {}
    run_id = _annotation(stages, C.ANNOTATION_MLFLOW_RUN_ID) or prev.get("mlflowRunId")
    url = _annotation(stages, C.ANNOTATION_MLFLOW_URL) or prev.get("mlflowUrl")
    step = _annotation(stages, C.ANNOTATION_CHECKPOINT_STEP) or str(prev.get("lastCheckpointStep") or "")
    if run_id:
        out["mlflowRunId"] = run_id
    if url:
        out["mlflowUrl"] = url
    if step and step.isdigit():
        out["lastCheckpointStep"] = int(step)
    return out


#: The keys of a seed run's own status (`build_status`) that its `status.seedRuns` entry keeps, in this order.
SEED_RUN_KEYS = (
    "runName",
    "phase",
    "stage",
    "jobName",
    "message",
    "startTime",
    "completionTime",
    "lastCheckpointStep",
    "mlflowRunId",
    "mlflowUrl",
)


def seed_run_entry(seed: int, run_status: dict[str, Any]) -> dict[str, Any]:
    """One element of `status.seedRuns`: the seed and its run's status from `build_status`, without conditions."""
    return {"seed": seed, **{k: run_status[k] for k in SEED_RUN_KEYS if k in run_status}}


def group_phase(phases: list[Phase | str]) -> Phase:
    """Phase of a multi-seed Experiment from the phases of its seed runs (at least one).

    Running while any seed run is Running, else Queued while any waits for Kueue, else Pending while any is Pending
    (not started, or between stages);
    only when every seed run has finished: Failed if any failed, else Succeeded. A failed seed does not end the
    Experiment while other seeds still run: a finished phase releases the spec-edit lock and stops the periodic
    re-sync, and those seeds' jobs still run (their failure is in `message` and `seedRuns` meanwhile).
    """
    if not phases:
        raise ValueError("a multi-seed Experiment has at least one seed run")
    found = {Phase(p) for p in phases}
    for phase in (Phase.RUNNING, Phase.QUEUED, Phase.PENDING, Phase.FAILED):
        if phase in found:
            return phase
    return Phase.SUCCEEDED


def build_group_status(
    previous: dict[str, Any] | None,
    seed_runs: list[dict[str, Any]],
    *,
    run_name: str,
    spec_hash: str,
    generation: int | None,
    now: str,
) -> dict[str, Any]:
    """The status of a multi-seed Experiment from its `seedRuns` entries (`seed_run_entry`, in seed order).

    `runName`/`specHash` name the group; `seeds` is "<succeeded>/<total>" (the SEEDS printer column); `stage` and
    `jobName` are those of the seed run the phase is about (the first failed one when Failed, else the first
    running, else the first pending, else the last); conditions as for a single run.
    """
    prev = dict(previous or {})
    conditions = set_condition(
        list(prev.get("conditions") or []),
        COND_VALID,
        True,
        "SpecValid",
        "the spec passed validation",
        now=now,
        generation=generation,
    )
    phase = group_phase([e["phase"] for e in seed_runs])
    succeeded = sum(1 for e in seed_runs if e["phase"] == Phase.SUCCEEDED)
    failed = [e for e in seed_runs if e["phase"] == Phase.FAILED]
    # The phase of a group is the phase of at least one of its seed runs: the first such one is in focus.
    focus = seed_runs[-1] if phase == Phase.SUCCEEDED else next(e for e in seed_runs if e["phase"] == phase)
    total = len(seed_runs)
    if phase == Phase.SUCCEEDED:
        message = f"all {total} seeds succeeded: seeds {', '.join(str(e['seed']) for e in seed_runs)}"
    else:
        message = f"{succeeded}/{total} seeds succeeded"
        if failed:
            message += "; " + "; ".join(f"seed {e['seed']} failed: {e['message']}" for e in failed)
        if phase in ACTIVE:
            message += f"; seed {focus['seed']}: {focus['message']}"
    conditions = phase_conditions(
        conditions, phase, message, ("AllSeedsSucceeded", "SeedFailed"), now=now, generation=generation
    )
    status: dict[str, Any] = {
        "phase": phase.value,
        "observedGeneration": generation,
        "runName": run_name,
        "specHash": spec_hash,
        "seeds": f"{succeeded}/{total}",
        "stage": focus["stage"],
        "jobName": focus["jobName"],
        "message": message,
        "conditions": conditions,
        "seedRuns": seed_runs,
    }
    starts = [e["startTime"] for e in seed_runs if e.get("startTime")]
    start = min(starts) if starts else prev.get("startTime")
    if phase != Phase.PENDING and not start:
        start = now
    if start:
        status["startTime"] = start
    if phase in TERMINAL:
        ends = [e["completionTime"] for e in seed_runs if e.get("completionTime")]
        status["completionTime"] = prev.get("completionTime") or (max(ends) if ends else now)
    if generation is None:
        status.pop("observedGeneration")
    return status


def invalid_status(
    previous: dict[str, Any] | None, message: str, *, generation: int | None, now: str
) -> dict[str, Any]:
    """Status of a spec that failed validation: phase Invalid, the full message, no children."""
    conditions = set_condition(
        list((previous or {}).get("conditions") or []),
        COND_VALID,
        False,
        "InvalidSpec",
        message,
        now=now,
        generation=generation,
    )
    status: dict[str, Any] = {"phase": Phase.INVALID.value, "message": message, "conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def refused_status(
    previous: dict[str, Any], new_run: str | None, *, generation: int | None, now: str, invalid: str | None = None
) -> dict[str, Any]:
    """Status after a spec edit of an active run: the run continues unchanged; the edit is reported, not applied."""
    old_run = previous.get("runName", "?")
    head = f"spec changed while run {old_run} is {previous.get('phase', 'active')}; its jobs are not modified. "
    if invalid is not None:
        message = head + f"The new spec is also invalid: {invalid}"
    else:
        message = head + (
            f"A changed spec is a new run ({new_run}): apply it as a new Experiment (new metadata.name), delete "
            "this Experiment and apply it again, or annotate this Experiment "
            f"{C.ANNOTATION_ON_SPEC_CHANGE}={C.SPEC_CHANGE_NEW_RUN} to stop this run and start it; re-applying the "
            "running spec clears this condition"
        )
    conditions = set_condition(
        list(previous.get("conditions") or []),
        COND_SPEC_CHANGE_REFUSED,
        True,
        "RunInProgress",
        message,
        now=now,
        generation=generation,
    )
    status = {**previous, "conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def clear_refusal(status: dict[str, Any], *, now: str, generation: int | None) -> dict[str, Any]:
    """Drop a previous refusal once the spec is back to the running one (or the run has finished)."""
    if not true_condition(status.get("conditions"), COND_SPEC_CHANGE_REFUSED):
        return status
    conditions = set_condition(
        list(status["conditions"]),
        COND_SPEC_CHANGE_REFUSED,
        False,
        "SpecMatchesRun",
        "the spec matches the run",
        now=now,
        generation=generation,
    )
    return {**status, "conditions": conditions}
