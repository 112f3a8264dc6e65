"""What the served models of a spec share: which model (`ModelRef`), how it samples (`Sampling`), and the Secret
that holds a server's credential (`SecretRef`: the user simulator's API key, the tracking URI)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from longhaul.spec.base import SpecModel
from longhaul.spec.bounds import Tokens
from longhaul.spec.paths import SafePath
from longhaul.spec.strings import SafeToken

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"
REVISION = r"^([0-9a-f]{40}|v?[0-9][A-Za-z0-9._-]*)$"
ModelName = Annotated[str, Field(pattern=MODEL_NAME, max_length=256)]


class ModelRef(SpecModel):
    """A model baked into the image (resolved offline by name through HF_HOME, or by `path`)."""

    name: ModelName = Field(description="Hugging Face repository id, e.g. Qwen/Qwen2.5-7B-Instruct.")
    revision: str | None = Field(
        default=None,
        pattern=REVISION,
        max_length=128,
        description="Pinned revision (40-hex commit or a version tag) baked into the image; null = as baked.",
    )
    path: SafePath | None = Field(
        default=None, description="Local directory of the model; null = resolve `name` in HF_HOME offline."
    )


class Sampling(SpecModel):
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature.")
    top_p: float = Field(default=0.9, gt=0.0, le=1.0, description="Nucleus sampling threshold.")
    max_tokens: Tokens | None = Field(
        default=None, description="Per-call token cap; null = environment.max_tokens_per_turn."
    )


class SecretRef(SpecModel):
    name: SafeToken = Field(description="Kubernetes Secret name.")
    key: SafeToken = Field(description="Key inside the Secret.")
