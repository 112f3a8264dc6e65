"""veRL plugin: registers the longhaul advantage estimators in every process that imports veRL.

Loaded by `import verl` through the `verl.plugins` entry point declared in pyproject.toml
(`longhaul = "longhaul.algos.verl_plugin"`), so the driver, the TaskRunner and every Ray worker see the same
registry. Names: `longhaul.algos.settings.ESTIMATOR_NAMES`, one `longhaul_<advantage>` per `spec.algorithm.advantage`.
Settings come from veRL's `algorithm` config (`+algorithm.longhaul.*`, see `longhaul.algos.settings`).
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo import core_algos

from longhaul.algos.estimators import compute_advantages
from longhaul.algos.settings import ADVANTAGES, ESTIMATOR_PREFIX, LonghaulSettings


def _make_estimator(advantage: str):
    def estimator(
        token_level_rewards: Any,
        response_mask: Any,
        index: Any = None,
        config: Any = None,
        epsilon: float = 1e-6,
        **_: Any,
    ):
        s = LonghaulSettings.from_config(config)
        return compute_advantages(
            token_level_rewards,
            response_mask,
            index,
            advantage=advantage,
            alpha=s.alpha,
            discount_unit=s.discount_unit,
            length_exponent=s.length_exponent,
            seed_compat=s.seed_compat,
            credit=s.credit,
            norm_by_std=s.norm_adv_by_std,
            epsilon=epsilon,
        )

    estimator.__name__ = f"compute_{ESTIMATOR_PREFIX}{advantage}_advantage"
    estimator.__qualname__ = estimator.__name__
    estimator.__doc__ = f"longhaul '{advantage}' advantage estimator (see longhaul.algos.estimators)."
    return estimator


ESTIMATORS = {}
for _adv in ADVANTAGES:
    _name = ESTIMATOR_PREFIX + _adv
    _existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(_name)
    if _existing is not None and getattr(_existing, "__module__", None) == __name__:
        ESTIMATORS[_name] = _existing  # module re-executed (importlib.reload): keep the first registration
        continue
    ESTIMATORS[_name] = core_algos.register_adv_est(_name)(_make_estimator(_adv))
