"""`spec.reward.rules`: typed per-rule overrides of PRM-Lite's parameters.

One model per rule, built from PRM-Lite's tables, which the rule engine reads too (`longhaul.spec.prm_lite_params`:
`RULE_DEFAULTS` for the names and defaults, `PARAM_DOMAINS` for each parameter's type and bounds), so a new
parameter is typed and bounded where it is defined. Weights are finite numbers in their range; counts (`window`,
`min_chars`, …) are whole numbers (2.5, −3 and 1e18 are refused); `aggregate.clip` is positive; `enabled` is a
boolean. Types are strict: `true` is not 1 and `"0.1"` is not a number.

A rules block serialises to exactly what was given (rules and parameters left out stay out), so the spec hash
and the resolved spec are those of the plain mapping the field used to be.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    create_model,
    model_serializer,
)

from longhaul.spec.prm_lite_params import PARAM_DOMAINS, RULE_DEFAULTS, ParamDomain


class _Given(BaseModel):
    """Frozen, closed, finite; dumps only the fields that were given."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_serializer(mode="wrap")
    def _only_given(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


def _param_type(domain: ParamDomain) -> Any:
    base = StrictInt if domain.type is int else StrictFloat
    low = {"gt": domain.low} if domain.low_open else {"ge": domain.low}
    return Annotated[base, Field(**low, le=domain.high)]


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _rule_model(rule: str) -> type[BaseModel]:
    fields: dict[str, Any] = {
        "enabled": (StrictBool | None, Field(default=None, description="false turns the rule off (default true)."))
    }
    for param, domain in PARAM_DOMAINS[rule].items():
        kind = "whole number" if domain.type is int else "number"
        span = (
            f"above {_num(domain.low)}, up to {_num(domain.high)}"
            if domain.low_open
            else f"from {_num(domain.low)} to {_num(domain.high)}"
        )
        fields[param] = (
            _param_type(domain) | None,
            Field(default=None, description=f"Default {_num(RULE_DEFAULTS[rule][param])}; a {kind} {span}."),
        )
    return create_model(f"{_camel(rule)}Rule", __base__=_Given, __doc__=f"PRM-Lite rule '{rule}'.", **fields)


RULE_MODELS: dict[str, type[BaseModel]] = {rule: _rule_model(rule) for rule in RULE_DEFAULTS}


class _Rules(_Given):
    def overrides(self) -> dict[str, dict[str, float | bool]]:
        """The given overrides as the rule engine takes them (`longhaul.rewards.prm_lite.build_rule_params`)."""
        return self.model_dump(mode="python")


RulesSpec: type[_Rules] = create_model(
    "RulesSpec",
    __base__=_Rules,
    __doc__="Per-rule overrides of PRM-Lite's weights and thresholds, by rule name.",
    **{rule: (model | None, Field(default=None, description=model.__doc__)) for rule, model in RULE_MODELS.items()},
)
