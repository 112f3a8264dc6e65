"""`metadata`: the Kubernetes object metadata of an Experiment. Only `name` is part of the run name."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from longhaul.constants import (
    ANNOTATION_GIT_COMMIT,
    ANNOTATION_ON_SPEC_CHANGE,
    ENV_GIT_COMMIT,
    SPEC_CHANGE_POLICIES,
    SPEC_CHANGE_REFUSE,
)
from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.strings import DNS1123_LABEL, K8sLabelValue, QualifiedName, is_dns1123_label

#: DNS-1123 label, short enough that `<name>-<8 hex>` stays a valid 63-character label.
MAX_NAME_LEN = 54
#: Annotation values may span lines (Kubernetes allows any text); NUL and YAML's extra line breaks are refused.
ANNOTATION_TEXT = r"^[^\x00\x85" + "\u2028\u2029" + r"]*$"
#: A commit or revision as GitOps tools record it (a SHA, `main@sha1:<sha>`): it becomes a container variable.
GIT_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$"


class Metadata(SpecModel):
    """Kubernetes object metadata. Only `name` is used to derive the run name."""

    name: str = Field(
        description=f"Experiment name: a DNS-1123 label of at most {MAX_NAME_LEN} characters "
        "(the run name appends '-' and 8 hex characters)."
    )
    namespace: str | None = Field(default=None, pattern=DNS1123_LABEL, max_length=63, description="Namespace.")
    labels: dict[QualifiedName, K8sLabelValue] = Field(
        default_factory=dict, description="Labels (not part of the run hash)."
    )
    annotations: dict[QualifiedName, Annotated[str, Field(pattern=ANNOTATION_TEXT)]] = Field(
        default_factory=dict,
        description="Annotations (not part of the run hash); `longhaul.dev/git-commit` records the specs "
        "repository commit set by GitOps tooling; `longhaul.dev/on-spec-change` (Kubernetes operator: `refuse`, "
        "the default, or `new-run`) says what a spec edit of an active run does: refused while the run goes on, "
        "or the run is stopped and the edited spec starts as a new run.",
    )

    @field_validator("name")
    @classmethod
    def _dns1123(cls, v: str) -> str:
        if len(v) > MAX_NAME_LEN:
            raise ValueError(f"must be at most {MAX_NAME_LEN} characters (got {len(v)})")
        if not is_dns1123_label(v):
            raise ValueError(
                "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
                "letter or digit"
            )
        return v

    @field_validator("annotations")
    @classmethod
    def _git_commit(cls, v: dict[str, str]) -> dict[str, str]:
        commit = v.get(ANNOTATION_GIT_COMMIT)
        if commit is not None and not re.fullmatch(GIT_REVISION, commit):
            raise FieldError(
                ANNOTATION_GIT_COMMIT,
                f"annotation {ANNOTATION_GIT_COMMIT} must be a commit as GitOps "
                "tools record it (e.g. 0123abc or main@sha1:0123abc): it becomes the job's "
                f"{ENV_GIT_COMMIT} variable and an MLflow tag",
            )
        return v

    @field_validator("annotations")
    @classmethod
    def _on_spec_change(cls, v: dict[str, str]) -> dict[str, str]:
        policy = v.get(ANNOTATION_ON_SPEC_CHANGE)
        if policy is not None and policy not in SPEC_CHANGE_POLICIES:
            raise FieldError(
                ANNOTATION_ON_SPEC_CHANGE,
                f"annotation {ANNOTATION_ON_SPEC_CHANGE}: {policy!r} is not a "
                f"policy; use {' or '.join(SPEC_CHANGE_POLICIES)} (absent: {SPEC_CHANGE_REFUSE})",
            )
        return v
