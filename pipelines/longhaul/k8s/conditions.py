"""The Experiment's status conditions (pure): set one, and the Running/Complete/Failed and Queued conditions of a
phase. `lastTransitionTime` changes only when a condition's status flips."""

from __future__ import annotations

from typing import Any

from longhaul.k8s.workloads import ACTIVE, SUSPENDED, Admission, Phase, find_condition

# Condition types written by the operator.
COND_VALID = "Valid"
COND_RUNNING = "Running"
COND_COMPLETE = "Complete"
COND_FAILED = "Failed"
COND_SPEC_CHANGE_REFUSED = "SpecChangeRefused"
COND_QUEUED = "Queued"


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


def phase_conditions(
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


def queued_condition(
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
    if find_condition(conditions, COND_QUEUED) is not None:
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
