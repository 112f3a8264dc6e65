"""`status.history` of an Experiment (pure): the runs it had, newest last, one entry per run."""

from __future__ import annotations

from typing import Any

from longhaul import constants as C
from longhaul.k8s.workloads import Phase

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
