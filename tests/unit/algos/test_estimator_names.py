"""The estimator names have one source, the spec's `Advantage` enum: what the estimators accept, what the veRL
plugin registers and what the renderer asks veRL for all derive from it, so a new advantage cannot be half added."""

from __future__ import annotations

import pytest

from longhaul.algos import estimators, settings
from longhaul.spec.algorithm import Advantage, DiscountUnit
from longhaul.spec.reward import Credit

pytestmark = pytest.mark.verl


def test_names_follow_the_spec_enums() -> None:
    assert settings.ADVANTAGES == tuple(a.value for a in Advantage) == estimators.ADVANTAGES
    assert settings.CREDITS == tuple(c.value for c in Credit)
    assert settings.DISCOUNT_UNITS == tuple(u.value for u in DiscountUnit)
    assert settings.ESTIMATOR_NAMES == tuple(settings.ESTIMATOR_PREFIX + a for a in settings.ADVANTAGES)
    assert settings.LENGTH_SCALED | settings.DISCOUNTED <= set(settings.ADVANTAGES)


def test_the_plugin_registers_exactly_the_named_estimators() -> None:
    import verl  # noqa: F401  (loads the entry-point plugins)
    from verl.trainer.ppo import core_algos

    from longhaul.algos import verl_plugin

    assert tuple(verl_plugin.ESTIMATORS) == settings.ESTIMATOR_NAMES
    registered = {
        k
        for k, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items()
        if getattr(fn, "__module__", None) == verl_plugin.__name__
    }
    assert registered == set(settings.ESTIMATOR_NAMES)


@pytest.mark.parametrize("advantage", list(Advantage))
@pytest.mark.parametrize("credit", list(Credit))
def test_every_rendered_estimator_is_registered(advantage: Advantage, credit: Credit) -> None:
    from types import SimpleNamespace

    spec = SimpleNamespace(algorithm=SimpleNamespace(advantage=advantage), reward=SimpleNamespace(credit=credit))
    name = settings.estimator_name(spec)
    assert name in settings.ESTIMATOR_NAMES or (name == "grpo" and advantage == "grpo" and credit == "trajectory")
