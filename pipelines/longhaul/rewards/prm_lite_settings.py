"""PRM-Lite's rule names and parameter table: `RULE_DEFAULTS` merged with the spec's overrides (pure).

The defaults and each parameter's domain are in `longhaul.spec.prm_lite_params`, the table the spec validates
`spec.reward.rules` against; `build_rule_params` applies the same domains to direct callers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longhaul.spec.prm_lite_params import PARAM_DOMAINS, RULE_DEFAULTS

#: Rules evaluated per history entry, in report order.
STEP_RULES = (
    "placeholder",
    "redundancy",
    "error_repetition",
    "recovery",
    "escalation",
    "data_chain",
    "first_read",
    "think_bonus",
    "cheap_reasoning",
)
#: Rules evaluated once per trajectory.
TRAJECTORY_RULES = ("no_reasoning", "read_diversity", "length_penalty", "unknown_tool")


class RuleParams:
    """The merged PRM-Lite parameter table: defaults from `RULE_DEFAULTS` plus the spec's overrides."""

    __slots__ = ("_values", "_enabled")

    def __init__(self, values: dict[str, dict[str, float]], enabled: dict[str, bool]) -> None:
        self._values = values
        self._enabled = enabled

    def get(self, rule: str, param: str) -> float:
        """A parameter's value."""
        return self._values[rule][param]

    def enabled(self, rule: str) -> bool:
        """Whether the rule is on."""
        return self._enabled[rule]

    def as_dict(self) -> dict[str, dict[str, float | bool]]:
        """Every rule's parameters and its `enabled` switch."""
        return {r: {**v, "enabled": self._enabled[r]} for r, v in self._values.items()}


def build_rule_params(overrides: Mapping[str, Mapping[str, float | bool]] | None = None) -> RuleParams:
    """Merge per-rule overrides (`spec.reward.rules`) into the defaults. Unknown names raise ValueError with
    the valid choices (the spec validates them first; this guards direct callers)."""
    values = {r: dict(p) for r, p in RULE_DEFAULTS.items()}
    enabled = dict.fromkeys(RULE_DEFAULTS, True)
    for rule, params in (overrides or {}).items():
        if rule not in values:
            raise ValueError(f"unknown PRM-Lite rule '{rule}'; valid: {', '.join(RULE_DEFAULTS)}")
        for name, value in params.items():
            if name == "enabled":
                enabled[rule] = bool(value)
            elif name in values[rule]:
                values[rule][name] = _in_domain(rule, name, value)
            else:
                raise ValueError(
                    f"PRM-Lite rule '{rule}': unknown parameter '{name}'; valid: {', '.join([*values[rule], 'enabled'])}"  # noqa: E501 - a string literal kept whole
                )
    return RuleParams(values, enabled)


def _in_domain(rule: str, name: str, value: Any) -> float:
    """`value` as a float when it lies in the parameter's domain (`PARAM_DOMAINS`: type, bounds; never NaN)."""
    dom = PARAM_DOMAINS[rule][name]
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (dom.type is float or float(value).is_integer())
    ok = ok and (dom.low < value if dom.low_open else dom.low <= value) and value <= dom.high
    if not ok:
        raise ValueError(
            f"PRM-Lite rule '{rule}': {name} must be a {'whole ' if dom.type is int else ''}number "
            f"{'above' if dom.low_open else 'from'} {dom.low:g} to {dom.high:g} (got {value!r})"
        )
    return float(value)


DEFAULT_PARAMS = build_rule_params()
