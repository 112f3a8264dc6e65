"""Experiment status from the state of its stage workloads (pure: dicts in, dicts out; time is an argument).

The operator reads the Experiment and its children, calls `build_status`, writes the result to the status
subresource and creates `next_stage` when the previous stages succeeded. A multi-seed Experiment has one stage
chain per seed run: `build_status` per seed run, `seed_run_entry` of each, `build_group_status` over them.
Everything here is deterministic and unit-tested without a cluster.

Size: over 400 lines because the one pure status state machine for every workload kind, with conditions and history.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from longhaul import constants as C


class Phase(StrEnum):
    PENDING = "Pending"
    #: Waiting for Kueue to admit the stage workload (created suspended, or suspended again by a preemption).
    QUEUED = "Queued"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    #: Only in `status.history`: a run stopped because the spec changed under the `new-run` policy
    #: (`supersede_history`); the Experiment itself is then in the phases of the run that replaced it.
    SUPERSEDED = "Superseded"
    #: Never written by the operator: a batch backend's job state that longhaul has no mapping for (e.g. a Slurm
    #: state newer than `longhaul.submit.slurm.PHASES`, or a job Slurm no longer knows), shown as is by `status`.
    UNKNOWN = "Unknown"


TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.INVALID, Phase.SUPERSEDED}
ACTIVE = {Phase.PENDING, Phase.QUEUED, Phase.RUNNING}

# Condition types written by the operator.
COND_VALID = "Valid"
COND_RUNNING = "Running"
COND_COMPLETE = "Complete"
COND_FAILED = "Failed"
COND_SPEC_CHANGE_REFUSED = "SpecChangeRefused"
COND_QUEUED = "Queued"

#: Reasons of a Kueue Workload's `QuotaReserved=False` condition (Kueue v0.19, apis/kueue/v1beta2) that no amount of
#: waiting fixes: the LocalQueue or ClusterQueue is missing or stopped, or the workload asks for more than the
#: queue can ever give. Other reasons (Pending, WaitingForQuota, PendingEvaluation, …) mean "wait your turn".
KUEUE_INADMISSIBLE = frozenset({"Inadmissible", "Misconfigured", "ExceedsMaxQuota", "NoMatchingFlavor", "Suspended"})


def _true(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind and c.get("status") == "True"), None)


def workload_phase(obj: dict[str, Any] | None) -> Phase:
    """Phase of one stage workload: a batch/v1 Job, a KubeRay RayJob or a JobSet (None = not created yet).

    A finished workload is Succeeded or Failed whatever its `spec.suspend`; an unfinished one with
    `spec.suspend: true` is Queued: only Kueue suspends longhaul's workloads (they are created suspended with a
    queue, unsuspended to admit them and suspended again to preempt them).
    """
    if obj is None:
        return Phase.PENDING
    status = obj.get("status") or {}
    kind = obj.get("kind", "Job")
    suspended = bool((obj.get("spec") or {}).get("suspend"))
    if kind == "RayJob":
        # KubeRay v1.7 (ray-operator/apis/ray/v1/rayjob_types.go): jobStatus is Ray's view of the job,
        # jobDeploymentStatus KubeRay's lifecycle (Initializing, Running, Complete, Failed, ValidationFailed,
        # Suspending, Suspended, Retrying, Waiting); a suspend resets jobStatus to "".
        job_status = status.get("jobStatus")
        deploy = status.get("jobDeploymentStatus")
        if job_status == "SUCCEEDED" or deploy == "Complete" and job_status != "FAILED":
            return Phase.SUCCEEDED
        if job_status in ("FAILED", "STOPPED") or deploy in ("Failed", "ValidationFailed"):
            return Phase.FAILED
        if suspended or deploy in ("Suspending", "Suspended"):
            return Phase.QUEUED
        return Phase.RUNNING if job_status == "RUNNING" or deploy == "Running" else Phase.PENDING
    conditions = status.get("conditions")
    if kind == "JobSet":
        # JobSet v0.12 (api/jobset/v1alpha2): Completed / Failed / Suspended conditions, per-replicatedJob counts.
        if _true(conditions, "Completed"):
            return Phase.SUCCEEDED
        if _true(conditions, "Failed"):
            return Phase.FAILED
        if suspended:
            return Phase.QUEUED
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
    if suspended:
        return Phase.QUEUED
    # `active` counts pods that are not finished, including unscheduled ones: only ready pods mean Running.
    if int(status.get("ready") or 0) > 0:
        return Phase.RUNNING
    return Phase.PENDING


def workload_message(obj: dict[str, Any] | None) -> str:
    """The reason/message of a terminal Job or JobSet condition (e.g. DeadlineExceeded), or of a finished RayJob
    (KubeRay's status.reason/message, e.g. AppFailed), if any."""
    status = (obj or {}).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget", "Complete", "Completed"):
            return ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
    if (obj or {}).get("kind") == "RayJob":
        return ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
    return ""


def _cond(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind), None)


@dataclass(frozen=True)
class Admission:
    """What Kueue says about a queued stage workload: `reason` (a word for the Queued condition), `message`
    (for the Experiment's status) and whether it is `inadmissible` (it will not start until someone acts)."""

    reason: str
    message: str
    inadmissible: bool = False


#: A suspended workload of an Experiment without a queue (someone suspended it by hand): it waits for that someone.
SUSPENDED = Admission("Suspended", "the workload is suspended (spec.suspend: true); it starts when unsuspended")


def kueue_admission(workload: dict[str, Any] | None, queue: str | None) -> Admission:
    """Why a queued workload waits, from the Kueue `Workload` object Kueue made for it (None: not made yet).

    Kueue v0.19 reports it in the Workload's conditions (apis/kueue/v1beta2/workload_types.go): `QuotaReserved`
    False with a reason (see KUEUE_INADMISSIBLE) and a message; after a preemption `Evicted` True (reason
    Preempted) and `Preempted` True (InClusterQueue, InCohort…); a deactivated workload (`spec.active: false`,
    e.g. past its requeue limit) has `Evicted` True with reason Deactivated and never starts again by itself.
    """
    where = f"LocalQueue {queue}" if queue else "its LocalQueue"
    if workload is None:
        return Admission("WaitingForAdmission", f"waiting for Kueue to admit it in {where}")
    name = (workload.get("metadata") or {}).get("name", "?")
    conditions = (workload.get("status") or {}).get("conditions")
    evicted = _true(conditions, "Evicted")
    if (workload.get("spec") or {}).get("active") is False:
        detail = ": ".join(x for x in ((evicted or {}).get("reason"), (evicted or {}).get("message")) if x)
        return Admission(
            "Deactivated",
            f"Kueue deactivated workload {name}"
            + (f" ({detail})" if detail else "")
            + "; it will not be admitted again until spec.active is set back to true",
            True,
        )
    reserved = _cond(conditions, "QuotaReserved")
    if reserved is not None and reserved.get("status") == "False" and reserved.get("reason") in KUEUE_INADMISSIBLE:
        return Admission(
            "Inadmissible",
            f"Kueue cannot admit workload {name} in {where}: "
            f"{reserved.get('reason')}: {reserved.get('message', '')}".rstrip(": "),
            True,
        )
    if evicted is not None and evicted.get("reason") == "Preempted":
        how = _true(conditions, "Preempted") or evicted
        return Admission(
            "Preempted",
            f"preempted by Kueue ({how.get('reason')}: {how.get('message', '')}); "
            f"waiting to be admitted again in {where}, then it resumes from its last checkpoint",
        )
    waiting = (reserved or {}).get("message") if (reserved or {}).get("status") == "False" else None
    return Admission(
        "WaitingForAdmission",
        f"waiting for Kueue to admit workload {name} in {where}" + (f": {waiting}" if waiting else ""),
    )


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


def _phase_conditions(
    conditions: list[dict[str, Any]],
    phase: Phase,
    message: str,
    reasons: tuple[str, str],
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The Running, Complete and Failed conditions of `phase`; `reasons` = (complete reason, failed reason)."""
    complete, failed = reasons
    conditions = set_condition(
        conditions, COND_RUNNING, phase == Phase.RUNNING, phase.value, message, now=now, generation=generation
    )
    conditions = set_condition(
        conditions,
        COND_COMPLETE,
        phase == Phase.SUCCEEDED,
        complete if phase == Phase.SUCCEEDED else "NotComplete",
        message,
        now=now,
        generation=generation,
    )
    return set_condition(
        conditions,
        COND_FAILED,
        phase == Phase.FAILED,
        failed if phase == Phase.FAILED else "NoFailure",
        message,
        now=now,
        generation=generation,
    )


def _queued_condition(
    conditions: list[dict[str, Any]],
    phase: Phase,
    admission: Admission | None,
    message: str,
    *,
    now: str,
    generation: int | None,
) -> list[dict[str, Any]]:
    """The Queued condition: True with Kueue's reason while Queued; set False once it was there (not added to
    Experiments that never queue)."""
    if phase == Phase.QUEUED:
        reason = (admission or SUSPENDED).reason
        return set_condition(conditions, COND_QUEUED, True, reason, message, now=now, generation=generation)
    if _cond(conditions, COND_QUEUED) is not None:
        return set_condition(
            conditions,
            COND_QUEUED,
            False,
            "Admitted" if phase in ACTIVE else phase.value,
            message,
            now=now,
            generation=generation,
        )
    return conditions


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
    elif any(p == Phase.QUEUED for p in phases):
        phase = Phase.QUEUED
        admission = current.admission or SUSPENDED
        message = f"stage {current.stage} is queued (job {current.name}): {admission.message}"
    else:
        phase = Phase.PENDING
        message = f"stage {current.stage} is waiting to start (job {current.name})"

    conditions = _phase_conditions(
        conditions, phase, message, ("AllStagesSucceeded", "StageFailed"), now=now, generation=generation
    )
    conditions = _queued_condition(conditions, phase, current.admission, message, now=now, generation=generation)

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
    # Kept from the previous status when no workload reports them (yet) again: a run that is preempted and
    # resumes keeps its MLflow run and checkpoint in the status.
    run_id = _annotation(stages, C.ANNOTATION_MLFLOW_RUN_ID) or prev.get("mlflowRunId")
    url = _annotation(stages, C.ANNOTATION_MLFLOW_URL) or prev.get("mlflowUrl")
    step = _annotation(stages, C.ANNOTATION_CHECKPOINT_STEP) or str(prev.get("lastCheckpointStep") or "")
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
    conditions = _phase_conditions(
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
    if not _true(status.get("conditions"), COND_SPEC_CHANGE_REFUSED):
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


HISTORY_LIMIT = C.STATUS_HISTORY_LIMIT


def record_history(
    history: list[dict[str, Any]] | None, status: dict[str, Any], *, git_commit: str | None
) -> list[dict[str, Any]]:
    """`status.history` after a reconcile whose status is `status`: the runs the Experiment had, newest last.

    A status naming a run other than the newest entry's appends an entry (a new run: the spec changed; or a
    change back to an earlier spec, which resumes that run: its second entry says when); otherwise the newest
    entry follows the run (phase, MLflow run id, completion time). `git_commit` (the `longhaul.dev/git-commit`
    annotation) is recorded when a run's entry is made, or later if it had none: a GitOps tool that stamps every
    object at every sync must not rewrite which commit started a run. A status without a run (Invalid) leaves the
    history as it was. At most HISTORY_LIMIT entries; the oldest are dropped.
    """
    out = [dict(e) for e in history or []]
    run = status.get("runName")
    if not run:
        return out[-HISTORY_LIMIT:]
    if not out or out[-1].get("runName") != run:
        out.append({"runName": run, "specHash": status.get("specHash", "")})
    entry = out[-1]
    entry["phase"] = status.get("phase", Phase.PENDING.value)
    if git_commit and not entry.get("gitCommit"):
        entry["gitCommit"] = git_commit
    for key in ("mlflowRunId", "startTime", "completionTime"):
        if status.get(key):
            entry[key] = status[key]
    return out[-HISTORY_LIMIT:]


def supersede_history(
    history: list[dict[str, Any]] | None, previous: dict[str, Any], *, now: str
) -> list[dict[str, Any]]:
    """`status.history` once the run of `previous` (the status before the spec edit) was stopped for a new run
    (policy `new-run`): its entry ends in phase Superseded at `now`.

    The newest entry is that run's when the history followed it; otherwise (a status older than the history) an
    entry is made from `previous`, as `record_history` would have. The same `previous` gives the same history
    (a reconcile repeated after a lost status write), up to `now`.
    """
    # No git commit: the Experiment's annotation now names the edit's commit, not the stopped run's.
    out = record_history(history, previous, git_commit=None)
    if out and previous.get("runName") and out[-1].get("runName") == previous["runName"]:
        out[-1]["phase"] = Phase.SUPERSEDED.value
        out[-1]["completionTime"] = out[-1].get("completionTime") or now
    return out
