"""Experiment status from the state of its stage workloads (pure: dicts in, dicts out; time is an argument).

The operator reads the Experiment and its children, calls `build_status`, writes the result to the status
subresource and creates `next_stage` when the previous stages succeeded. A multi-seed Experiment has one stage
chain per seed run: `build_status` per seed run, `seed_run_entry` of each, `build_group_status` over them.
Everything here is deterministic and unit-tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from longhaul import constants as C


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"


TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.INVALID}
ACTIVE = {Phase.PENDING, Phase.RUNNING}

# Condition types written by the operator.
COND_VALID = "Valid"
COND_RUNNING = "Running"
COND_COMPLETE = "Complete"
COND_FAILED = "Failed"
COND_SPEC_CHANGE_REFUSED = "SpecChangeRefused"


def _true(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind and c.get("status") == "True"), None)


def workload_phase(obj: dict[str, Any] | None) -> Phase:
    """Phase of one stage workload: a batch/v1 Job, a KubeRay RayJob or a JobSet (None = not created yet)."""
    if obj is None:
        return Phase.PENDING
    status = obj.get("status") or {}
    kind = obj.get("kind", "Job")
    if kind == "RayJob":
        job_status = status.get("jobStatus")
        deploy = status.get("jobDeploymentStatus")
        if job_status == "SUCCEEDED" or deploy == "Complete" and job_status != "FAILED":
            return Phase.SUCCEEDED
        if job_status in ("FAILED", "STOPPED") or deploy == "Failed":
            return Phase.FAILED
        return Phase.RUNNING if job_status == "RUNNING" or deploy == "Running" else Phase.PENDING
    conditions = status.get("conditions")
    if kind == "JobSet":
        if _true(conditions, "Completed"):
            return Phase.SUCCEEDED
        if _true(conditions, "Failed"):
            return Phase.FAILED
        active = sum(int(r.get("active", 0)) for r in status.get("replicatedJobsStatus") or [])
        return Phase.RUNNING if active else Phase.PENDING
    # batch/v1 Job: conditions when the Job controller wrote them, else the counters.
    if _true(conditions, "Complete") or _true(conditions, "SuccessCriteriaMet"):
        return Phase.SUCCEEDED
    if _true(conditions, "Failed") or _true(conditions, "FailureTarget"):
        return Phase.FAILED
    spec = obj.get("spec") or {}
    if int(status.get("succeeded") or 0) >= int(spec.get("completions") or 1):
        return Phase.SUCCEEDED
    if int(status.get("failed") or 0) > int(spec.get("backoffLimit", 6)):
        return Phase.FAILED
    # `active` counts pods that are not finished, including unscheduled ones: only ready pods mean Running.
    if int(status.get("ready") or 0) > 0:
        return Phase.RUNNING
    return Phase.PENDING


def workload_message(obj: dict[str, Any] | None) -> str:
    """The reason/message of a terminal Job condition, if any (e.g. DeadlineExceeded)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget", "Complete", "Completed"):
            return ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
    return ""


def set_condition(
    conditions: list[dict[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Return conditions with `kind` set; lastTransitionTime changes only when the status flips."""
    value = "True" if status else "False"
    out = []
    found = False
    for cond in conditions:
        if cond.get("type") != kind:
            out.append(cond)
            continue
        found = True
        new = {**cond, "status": value, "reason": reason, "message": message}
        if cond.get("status") != value:
            new["lastTransitionTime"] = now
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    if not found:
        new = {"type": kind, "status": value, "reason": reason, "message": message, "lastTransitionTime": now}
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out


def _phase_conditions(conditions: list[dict[str, Any]], phase: Phase, message: str, reasons: tuple[str, str], *,
                      now: str, generation: int | None) -> list[dict[str, Any]]:
    """The Running, Complete and Failed conditions of `phase`; `reasons` = (complete reason, failed reason)."""
    complete, failed = reasons
    conditions = set_condition(conditions, COND_RUNNING, phase == Phase.RUNNING, phase.value, message,
                               now=now, generation=generation)
    conditions = set_condition(conditions, COND_COMPLETE, phase == Phase.SUCCEEDED,
                               complete if phase == Phase.SUCCEEDED else "NotComplete", message,
                               now=now, generation=generation)
    return set_condition(conditions, COND_FAILED, phase == Phase.FAILED,
                         failed if phase == Phase.FAILED else "NoFailure", message, now=now, generation=generation)


@dataclass(frozen=True)
class StageView:
    """One stage and its workload as read from the cluster (None = not created yet)."""

    stage: str
    name: str
    workload: dict[str, Any] | None


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
    conditions = set_condition(conditions, COND_VALID, True, "SpecValid", "the spec passed validation",
                               now=now, generation=generation)
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
        phase = Phase.FAILED
        failed = next(v for v, p in zip(stages, phases, strict=True) if p == Phase.FAILED)
        current = failed
        detail = workload_message(failed.workload)
        message = f"stage {failed.stage} (job {failed.name}) failed" + (f": {detail}" if detail else "")
        next_stage = None
    elif all(p == Phase.SUCCEEDED for p in phases) and all(v.workload is not None for v in stages):
        phase = Phase.SUCCEEDED
        current = stages[-1]
        message = f"all stages succeeded: {', '.join(v.stage for v in stages)}"
    elif any(p == Phase.RUNNING for p in phases):
        phase = Phase.RUNNING
        message = f"stage {current.stage} is running (job {current.name})"
    else:
        phase = Phase.PENDING
        message = f"stage {current.stage} is waiting to start (job {current.name})"

    conditions = _phase_conditions(conditions, phase, message, ("AllStagesSucceeded", "StageFailed"),
                                   now=now, generation=generation)

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
    run_id = _annotation(stages, C.ANNOTATION_MLFLOW_RUN_ID)
    url = _annotation(stages, C.ANNOTATION_MLFLOW_URL)
    step = _annotation(stages, C.ANNOTATION_CHECKPOINT_STEP)
    if run_id:
        status["mlflowRunId"] = run_id
    if url:
        status["mlflowUrl"] = url
    if step and step.isdigit():
        status["lastCheckpointStep"] = int(step)
    if generation is None:
        status.pop("observedGeneration")
    return Reconciled(status=status, next_stage=next_stage)


#: The keys of a seed run's own status (`build_status`) that its `status.seedRuns` entry keeps, in this order.
SEED_RUN_KEYS = ("runName", "phase", "stage", "jobName", "message", "startTime", "completionTime",
                 "lastCheckpointStep", "mlflowRunId", "mlflowUrl")


def seed_run_entry(seed: int, run_status: dict[str, Any]) -> dict[str, Any]:
    """One element of `status.seedRuns`: the seed and its run's status from `build_status`, without conditions."""
    return {"seed": seed, **{k: run_status[k] for k in SEED_RUN_KEYS if k in run_status}}


def group_phase(phases: list[Phase | str]) -> Phase:
    """Phase of a multi-seed Experiment from the phases of its seed runs (at least one).

    Running while any seed run is Running, else Pending while any is Pending (not started, or between stages);
    only when every seed run has finished: Failed if any failed, else Succeeded. A failed seed does not end the
    Experiment while other seeds still run: a finished phase releases the spec-edit lock and stops the periodic
    re-sync, and those seeds' jobs still run (their failure is in `message` and `seedRuns` meanwhile).
    """
    if not phases:
        raise ValueError("a multi-seed Experiment has at least one seed run")
    found = {Phase(p) for p in phases}
    for phase in (Phase.RUNNING, Phase.PENDING, Phase.FAILED):
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
    conditions = set_condition(list(prev.get("conditions") or []), COND_VALID, True, "SpecValid",
                               "the spec passed validation", now=now, generation=generation)
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
    conditions = _phase_conditions(conditions, phase, message, ("AllSeedsSucceeded", "SeedFailed"),
                                   now=now, generation=generation)
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


def invalid_status(previous: dict[str, Any] | None, message: str, *, generation: int | None, now: str) -> dict[str, Any]:
    """Status of a spec that failed validation: phase Invalid, the full message, no children."""
    conditions = set_condition(list((previous or {}).get("conditions") or []), COND_VALID, False, "InvalidSpec",
                               message, now=now, generation=generation)
    status: dict[str, Any] = {"phase": Phase.INVALID.value, "message": message, "conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def refused_status(previous: dict[str, Any], new_run: str | None, *, generation: int | None, now: str,
                   invalid: str | None = None) -> dict[str, Any]:
    """Status after a spec edit of an active run: the run continues unchanged; the edit is reported, not applied."""
    old_run = previous.get("runName", "?")
    head = f"spec changed while run {old_run} is {previous.get('phase', 'active')}; its jobs are not modified. "
    if invalid is not None:
        message = head + f"The new spec is also invalid: {invalid}"
    else:
        message = head + (
            f"A changed spec is a new run ({new_run}): apply it as a new Experiment (new metadata.name), or delete "
            "this Experiment and apply it again; re-applying the running spec clears this condition"
        )
    conditions = set_condition(list(previous.get("conditions") or []), COND_SPEC_CHANGE_REFUSED, True,
                               "RunInProgress", message, now=now, generation=generation)
    status = {**previous, "conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def clear_refusal(status: dict[str, Any], *, now: str, generation: int | None) -> dict[str, Any]:
    """Drop a previous refusal once the spec is back to the running one (or the run has finished)."""
    if not _true(status.get("conditions"), COND_SPEC_CHANGE_REFUSED):
        return status
    conditions = set_condition(list(status["conditions"]), COND_SPEC_CHANGE_REFUSED, False, "SpecMatchesRun",
                               "the spec matches the run", now=now, generation=generation)
    return {**status, "conditions": conditions}
