"""Advantage estimators (pure torch, `longhaul.algos.estimators`), their veRL registration
(`longhaul.algos.verl_plugin`, loaded through the `verl.plugins` entry point) and the settings the renderer emits.

Importing this package does not import torch.
"""

from longhaul.algos.settings import (
    ESTIMATOR_NAMES,
    SETTING_KEYS,
    LonghaulSettings,
    estimator_name,
    render_algorithm_overrides,
    settings_from_spec,
)

__all__ = [
    "ESTIMATOR_NAMES",
    "SETTING_KEYS",
    "LonghaulSettings",
    "estimator_name",
    "render_algorithm_overrides",
    "settings_from_spec",
]
