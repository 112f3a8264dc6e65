"""What to do with an Experiment (pure): validate the stored object, own the children rendered for it, and decide
whether to track its run, refuse a spec edit, stop the run it replaces or report it invalid.

A spec edit while a run is active follows the Experiment's spec-change policy (`spec_change_policy`): refused (the
default), or the run is stopped and the edited spec starts as a new run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from longhaul import bounded
from longhaul import constants as C
from longhaul.k8s import status as S
from longhaul.spec import SpecError, build_experiment
from longhaul.spec.models import Experiment
from longhaul.spec.naming import run_name

#: Annotation prefixes written by tools, not by users: never part of the Experiment that is validated.
_TOOL_ANNOTATIONS = ("kubectl.kubernetes.io/", "kopf.zalando.org/", "meta.helm.sh/", "argocd.argoproj.io/")
EXPERIMENT_API = f"{C.API_GROUP}/{C.API_VERSION}"


def clean_document(body: dict[str, Any]) -> dict[str, Any]:
    """The user's Experiment from a stored object: server fields and tool annotations dropped."""
    meta = body.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(_TOOL_ANNOTATIONS)}
    clean_meta: dict[str, Any] = {"name": meta.get("name")}
    if meta.get("namespace"):
        clean_meta["namespace"] = meta["namespace"]
    if meta.get("labels"):
        clean_meta["labels"] = dict(meta["labels"])
    if annotations:
        clean_meta["annotations"] = annotations
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": clean_meta,
        "spec": copy.deepcopy(body.get("spec") or {}),
    }


def validate_body(body: dict[str, Any]) -> Experiment | str:
    """The validated Experiment, or the full multi-line error message (every problem, with field paths)."""
    meta = body.get("metadata") or {}
    where = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    try:
        # Bounded before the deep copy in clean_document (depth and node limits of `longhaul.bounded.SPEC`).
        bounded.check_data({"spec": body.get("spec")}, where, bounded.SPEC)
        exp = build_experiment(clean_document(body), file=where)
    except (bounded.InputError, SpecError) as exc:
        return str(exc)
    ns = meta.get("namespace")
    target = exp.spec.backends.kubernetes.namespace
    if target and ns and target != ns:
        return (
            f"{where} spec.backends.kubernetes.namespace: {target!r} differs from the Experiment's namespace "
            f"{ns!r}; the operator creates jobs next to their Experiment (owner references cannot cross "
            "namespaces): remove the field or apply the Experiment into that namespace"
        )
    return exp


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """Controller owner reference to the Experiment: deleting it garbage-collects every child."""
    meta = body["metadata"]
    return {
        "apiVersion": body.get("apiVersion", EXPERIMENT_API),
        "kind": body.get("kind", C.KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(objs: list[dict[str, Any]], body: dict[str, Any]) -> list[dict[str, Any]]:
    """Make freshly rendered `objs` owned by the Experiment, in its namespace (in place; returns them)."""
    for obj in objs:
        obj["metadata"]["namespace"] = body["metadata"]["namespace"]
        obj["metadata"]["ownerReferences"] = [owner_reference(body)]
    return objs


@dataclass(frozen=True)
class Decision:
    """What to do with an Experiment: `track` a run (maybe refusing an edit, or stopping the run it replaces) or
    report it `invalid`."""

    track: Experiment | None = None
    invalid: str | None = None
    refused_run: str | None = None  # the run name the edited spec would have had
    refused_invalid: str | None = None  # the edited spec's validation errors (the run continues)
    stop: Experiment | None = None  # policy new-run: the spec of the active run that `track` replaces


def decide(body: dict[str, Any], running: Experiment | None) -> Decision:
    """Pure decision. `running` is the spec of the active run (from its ConfigMap), when one is active.

    A valid edit of a locked run is refused, unless the edited Experiment's policy (`spec_change_policy`) is
    new-run: then an active run is stopped for it, and a finished run whose earlier edit was refused simply
    gives way to it. An invalid edit is refused under either policy (the run continues).
    """
    result = validate_body(body)
    status = body.get("status") or {}
    locked = run_locked(status)
    if isinstance(result, str):
        if locked and running is not None:
            return Decision(track=running, refused_invalid=result)
        return Decision(invalid=result)
    if locked and running is not None and run_name(result) != status["runName"]:
        if spec_change_policy(result) == C.SPEC_CHANGE_NEW_RUN:
            return Decision(track=result, stop=running if status.get("phase") in S.ACTIVE else None)
        return Decision(track=running, refused_run=run_name(result))
    return Decision(track=result)


def spec_change_policy(exp: Experiment) -> str:
    """What a spec edit of the Experiment's active run does: C.SPEC_CHANGE_REFUSE (the default) or
    C.SPEC_CHANGE_NEW_RUN, from the annotation `longhaul.dev/on-spec-change` (validated by the spec models).

    An annotation, not a spec field, because the policy is about the Experiment object, not the run: the spec
    hash (`longhaul.spec.models.canonical_document`) covers the whole spec and leaves metadata out by design, so
    setting or switching the policy alone never makes a new run; a spec field would be hashed, and one dropped
    from the dump would be missing from the resolved spec `longhaul submit` applies. Like `longhaul.dev/git-commit`,
    a GitOps tool can stamp it on every Experiment of a repository (e.g. kustomize `commonAnnotations`).
    """
    return exp.metadata.annotations.get(C.ANNOTATION_ON_SPEC_CHANGE, C.SPEC_CHANGE_REFUSE)


def run_locked(status: dict[str, Any]) -> bool:
    """Whether the spec is bound to the current run: while it is active, and after an edit was refused.

    A refused edit stays refused after the run finishes (it never starts by itself); re-applying the run's
    spec clears it. Editing a finished run without a refusal starts a new run.
    """
    if not status.get("runName"):
        return False
    refused = any(
        c.get("type") == S.COND_SPEC_CHANGE_REFUSED and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return status.get("phase") in S.ACTIVE or refused
