"""The phase of an Experiment and of each of its stage workloads (pure: dicts in, values out).

`workload_phase` reads a batch/v1 Job, a KubeRay RayJob or a JobSet; `kueue_admission` says why a queued one waits,
from the Kueue `Workload` made for it. `longhaul.k8s.status` builds the Experiment's status from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    """The phase of an Experiment (`status.phase`), of one of its seed runs, or of a batch job in `longhaul status`."""

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

#: Reasons of a Kueue Workload's `QuotaReserved=False` condition (Kueue v0.19, apis/kueue/v1beta2) that no amount of
#: waiting fixes: the LocalQueue or ClusterQueue is missing or stopped, or the workload asks for more than the
#: queue can ever give. Other reasons (Pending, WaitingForQuota, PendingEvaluation, …) mean "wait your turn".
KUEUE_INADMISSIBLE = frozenset({"Inadmissible", "Misconfigured", "ExceedsMaxQuota", "NoMatchingFlavor", "Suspended"})


def true_condition(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    """The condition of type `kind` when its status is True."""
    return next((c for c in conditions or [] if c.get("type") == kind and c.get("status") == "True"), None)


def find_condition(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    """The condition of type `kind`, whatever its status."""
    return next((c for c in conditions or [] if c.get("type") == kind), None)


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
        if true_condition(conditions, "Completed"):
            return Phase.SUCCEEDED
        if true_condition(conditions, "Failed"):
            return Phase.FAILED
        if suspended:
            return Phase.QUEUED
        active = sum(int(r.get("active", 0)) for r in status.get("replicatedJobsStatus") or [])
        return Phase.RUNNING if active else Phase.PENDING
    # batch/v1 Job: conditions when the Job controller wrote them, else the counters.
    if true_condition(conditions, "Complete") or true_condition(conditions, "SuccessCriteriaMet"):
        return Phase.SUCCEEDED
    if true_condition(conditions, "Failed") or true_condition(conditions, "FailureTarget"):
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
    evicted = true_condition(conditions, "Evicted")
    if (workload.get("spec") or {}).get("active") is False:
        detail = ": ".join(x for x in ((evicted or {}).get("reason"), (evicted or {}).get("message")) if x)
        return Admission(
            "Deactivated",
            f"Kueue deactivated workload {name}"
            + (f" ({detail})" if detail else "")
            + "; it will not be admitted again until spec.active is set back to true",
            True,
        )
    reserved = find_condition(conditions, "QuotaReserved")
    if reserved is not None and reserved.get("status") == "False" and reserved.get("reason") in KUEUE_INADMISSIBLE:
        return Admission(
            "Inadmissible",
            f"Kueue cannot admit workload {name} in {where}: "
            f"{reserved.get('reason')}: {reserved.get('message', '')}".rstrip(": "),
            True,
        )
    if evicted is not None and evicted.get("reason") == "Preempted":
        how = true_condition(conditions, "Preempted") or evicted
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
