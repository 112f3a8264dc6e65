"""What the veRL renderer emits for the advantage estimator: the estimator name and `algorithm.longhaul.*`.

The lead's renderer calls `estimator_name(exp)` and `settings_from_spec(exp)` instead of repeating this logic;
the veRL plugin reads the same keys back (`LonghaulSettings.from_config`). No torch import here.

The estimator names have one source, the spec's `Advantage` enum: `ADVANTAGES` (what the estimators accept),
`ESTIMATOR_NAMES` (what the veRL plugin registers) and the spec's validation all derive from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longhaul.rewards.combine import RewardSettings
from longhaul.spec.algorithm import Advantage, DiscountUnit
from longhaul.spec.reward import Credit

#: `spec.algorithm.advantage` values, in the enum's order: the estimators `longhaul.algos.estimators` computes.
ADVANTAGES: tuple[str, ...] = tuple(a.value for a in Advantage)
DISCOUNT_UNITS: tuple[str, ...] = tuple(u.value for u in DiscountUnit)
CREDITS: tuple[str, ...] = tuple(c.value for c in Credit)
#: Advantages that scale by the response length (LATA) and those that discount by position (Turn-Discount).
LENGTH_SCALED = frozenset({Advantage.LATA.value, Advantage.LATA_TURN_DISCOUNT.value})
DISCOUNTED = frozenset({Advantage.TURN_DISCOUNT.value, Advantage.LATA_TURN_DISCOUNT.value})

#: Names registered in veRL's advantage-estimator registry by `longhaul.algos.verl_plugin`: one per advantage.
ESTIMATOR_PREFIX = "longhaul_"
ESTIMATOR_NAMES: tuple[str, ...] = tuple(ESTIMATOR_PREFIX + a for a in ADVANTAGES)

#: Keys of `algorithm.longhaul` (rendered as `+algorithm.longhaul.<key>=<value>`), all required.
SETTING_KEYS = ("alpha", "discount_unit", "length_exponent", "seed_compat", "credit", "process_weight")


def _spec(exp: Any) -> Any:
    return exp.spec if hasattr(exp, "spec") else exp


def estimator_name(exp: Any) -> str:
    """veRL's `algorithm.adv_estimator` for an Experiment (or ExperimentSpec): veRL's own `grpo` for plain GRPO
    with trajectory credit, else `longhaul_<advantage>`."""
    spec = _spec(exp)
    adv = str(
        spec.algorithm.advantage.value if hasattr(spec.algorithm.advantage, "value") else spec.algorithm.advantage
    )
    credit = str(spec.reward.credit.value if hasattr(spec.reward.credit, "value") else spec.reward.credit)
    if adv == Advantage.GRPO and credit == Credit.TRAJECTORY:
        return "grpo"
    return ESTIMATOR_PREFIX + adv


def settings_from_spec(exp: Any) -> dict[str, Any]:
    """The `algorithm.longhaul` mapping for an Experiment: exactly the keys in `SETTING_KEYS`, plain Python
    values (render each as `+algorithm.longhaul.<key>=<value>`; booleans as `true`/`false`).

    `process_weight` is `spec.reward.weight` when a process reward is configured, else 0.0 (informational for
    the estimators: the weight is already applied by the agent loop when it builds the reward)."""
    spec = _spec(exp)
    alg, rew = spec.algorithm, spec.reward
    return {
        "alpha": float(alg.alpha),
        "discount_unit": str(getattr(alg.discount_unit, "value", alg.discount_unit)),
        "length_exponent": float(alg.length_exponent),
        "seed_compat": bool(alg.seed_compat),
        "credit": str(getattr(rew.credit, "value", rew.credit)),
        "process_weight": RewardSettings.from_spec(spec).process_weight,
    }


def render_algorithm_overrides(exp: Any) -> list[str]:
    """Hydra overrides for the estimator: `algorithm.adv_estimator=…`, `algorithm.norm_adv_by_std_in_grpo=…` and
    one `+algorithm.longhaul.<key>=…` per setting (a convenience for the renderer; same data as above)."""
    spec = _spec(exp)
    out = [
        f"algorithm.adv_estimator={estimator_name(exp)}",
        f"algorithm.norm_adv_by_std_in_grpo={'true' if spec.algorithm.norm_adv_by_std else 'false'}",
    ]
    for k, v in settings_from_spec(exp).items():
        out.append(f"+algorithm.longhaul.{k}={('true' if v else 'false') if isinstance(v, bool) else v}")
    return out


@dataclass(frozen=True)
class LonghaulSettings:
    """The estimator settings read back from veRL's `algorithm` config."""

    alpha: float
    discount_unit: str
    length_exponent: float
    seed_compat: bool
    credit: str
    process_weight: float
    norm_adv_by_std: bool

    @classmethod
    def from_config(cls, config: Any) -> LonghaulSettings:
        """Read `algorithm.longhaul.*` and `algorithm.norm_adv_by_std_in_grpo` from the config veRL passes to an
        estimator (a DictConfig or a plain mapping). Missing keys raise a ValueError that says what to render."""
        if config is None:
            raise ValueError(
                "longhaul estimators need veRL's algorithm config; got None. Render "
                + " ".join(f"+algorithm.longhaul.{k}=…" for k in SETTING_KEYS)
            )
        lh = _get(config, "longhaul")
        missing = [k for k in SETTING_KEYS if lh is None or _get(lh, k) is None]
        if missing:
            raise ValueError(
                "algorithm.longhaul is missing "
                + ", ".join(missing)
                + "; render them with "
                + " ".join(f"+algorithm.longhaul.{k}=<value>" for k in missing)
                + " (longhaul.algos.render_algorithm_overrides)"
            )
        norm = _get(config, "norm_adv_by_std_in_grpo")
        return cls(
            alpha=float(_get(lh, "alpha")),
            discount_unit=str(_get(lh, "discount_unit")),
            length_exponent=float(_get(lh, "length_exponent")),
            seed_compat=_as_bool(_get(lh, "seed_compat")),
            credit=str(_get(lh, "credit")),
            process_weight=float(_get(lh, "process_weight")),
            norm_adv_by_std=True if norm is None else _as_bool(norm),
        )


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    getter = getattr(obj, "get", None)
    return getter(key) if callable(getter) else getattr(obj, key, None)


def _as_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes")
    return bool(v)
