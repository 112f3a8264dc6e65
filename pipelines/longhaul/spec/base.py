"""What every model of the spec shares: frozen, closed and finite; and the error that names a field.

Field descriptions become the CRD's `kubectl explain` text and the README's field reference, and a model's docstring
its description in the JSON schema and the CRD, so write both for users.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class FieldError(ValueError):
    """A cross-field error that names the offending field (relative dotted path) for precise reports."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class SpecModel(BaseModel):
    """Base of every spec model: frozen, unknown keys refused, defaults validated too, NaN and infinity refused."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_enum_values=False, validate_default=True, allow_inf_nan=False
    )
