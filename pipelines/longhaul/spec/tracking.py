"""`spec.tracking`: where a run's MLflow records go, and what they hold besides the metrics."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.serving import SecretRef
from longhaul.spec.strings import ONE_LINE_TEXT, SafeToken, Url


class TrackingSpec(SpecModel):
    uri: Url | None = Field(
        default=None,
        description="MLflow tracking URI; null = local sqlite store under the run directory (local backend).",
    )
    uri_secret: SecretRef | None = Field(default=None, description="Secret holding the tracking URI (Kubernetes).")
    experiment: SafeToken | None = Field(
        default=None, description="MLflow experiment; null = 'longhaul/<metadata.name>' (the spec family)."
    )
    tags: dict[SafeToken, Annotated[str, Field(max_length=500, pattern=ONE_LINE_TEXT)]] = Field(
        default_factory=dict, description="Extra MLflow tags."
    )
    early_stop_on_collapse: bool = Field(default=False, description="Stop training when the collapse watchdog fires.")
    training_traces_per_step: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Training episodes per step logged as MLflow traces when the grpo stage ends (the first in "
        "(group, sample) order; every evaluated episode is traced). 0 = none.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> TrackingSpec:
        if self.uri and self.uri_secret:
            raise FieldError("uri_secret", "set either `uri` or `uri_secret`, not both")
        return self
