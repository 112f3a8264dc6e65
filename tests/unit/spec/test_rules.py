"""`spec.reward.rules`: typed per-rule models built from PRM-Lite's own parameter table (issue 30, class 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longhaul.rewards.prm_lite import build_rule_params
from longhaul.spec import SpecError, run_name
from longhaul.spec.load import build_experiment
from longhaul.spec.prm_lite_params import PARAM_DOMAINS, RULE_DEFAULTS
from longhaul.spec.rules import RULE_MODELS

SMOKE = Path(__file__).resolve().parents[3] / "specs" / "smoke.yaml"


def _with_rules(rules: object) -> dict:
    doc = yaml.safe_load(SMOKE.read_text(encoding="utf-8"))
    doc["spec"]["reward"]["rules"] = rules
    return doc


def test_every_parameter_has_a_typed_bounded_field() -> None:
    assert set(RULE_MODELS) == set(RULE_DEFAULTS) == set(PARAM_DOMAINS)
    for rule, params in RULE_DEFAULTS.items():
        assert set(RULE_MODELS[rule].model_fields) == {*params, "enabled"}
        for name, default in params.items():
            dom = PARAM_DOMAINS[rule][name]
            assert dom.low <= default <= dom.high and (dom.type is float or isinstance(default, int)), (rule, name)


@pytest.mark.parametrize(
    ("rules", "field", "fragment"),
    [
        ({"aggregate": {"clip": float("nan")}}, "aggregate.clip", "finite"),
        ({"aggregate": {"clip": -0.5}}, "aggregate.clip", "above 0"),
        ({"aggregate": {"clip": 0}}, "aggregate.clip", "above 0"),
        ({"redundancy": {"window": 2.5}}, "redundancy.window", "whole number"),
        ({"redundancy": {"window": -3}}, "redundancy.window", "from 1 to 1,000"),
        ({"redundancy": {"window": 10**18}}, "redundancy.window", "from 1 to 1,000"),
        ({"redundancy": {"window": True}}, "redundancy.window", "whole number"),
        ({"placeholder": {"read_weight": "0.1"}}, "placeholder.read_weight", "not a number"),
        ({"placeholder": {"read_weight": float("inf")}}, "placeholder.read_weight", "finite"),
        ({"redundancy": {"enabled": 1}}, "redundancy.enabled", "boolean"),
        ({"redundancy": {"wieght": 1}}, "redundancy.wieght", "did you mean 'weight'"),
        ({"placeholdr": {}}, "placeholdr", "did you mean 'placeholder'"),
    ],
)
def test_bad_rule_parameters_are_refused_by_field(rules: dict, field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        build_experiment(_with_rules(rules), "rules.yaml")
    (p,) = [p for p in info.value.problems if p.path == f"spec.reward.rules.{field}"]
    assert fragment in p.render(), p.render()


def test_rules_dump_as_given_so_the_run_name_is_the_mappings() -> None:
    """Only what was given is dumped: the canonical spec, its hash and the resolved spec are what they were when
    the field was a plain mapping (a spec without rules keeps its run name)."""
    exp = build_experiment(_with_rules({"redundancy": {"window": 5}, "aggregate": {"enabled": False}}), "r.yaml")
    assert exp.spec.reward.model_dump(mode="json")["rules"] == {
        "redundancy": {"window": 5},
        "aggregate": {"enabled": False},
    }
    assert build_experiment(_with_rules({}), "r.yaml").spec.reward.model_dump(mode="json")["rules"] == {}
    assert run_name(build_experiment(_with_rules({}), "r.yaml")) == "smoke-da788b58"  # the name before the change


def test_the_rule_engine_reads_the_overrides_and_refuses_values_outside_their_domain() -> None:
    exp = build_experiment(_with_rules({"redundancy": {"window": 5}, "aggregate": {"clip": 2.0}}), "r.yaml")
    params = build_rule_params(exp.spec.reward.rules.overrides())
    assert params.get("redundancy", "window") == 5 and params.get("aggregate", "clip") == 2.0
    assert params.get("placeholder", "read_weight") == RULE_DEFAULTS["placeholder"]["read_weight"]
    for bad in ({"aggregate": {"clip": float("nan")}}, {"redundancy": {"window": 2.5}}, {"aggregate": {"clip": -1}}):
        with pytest.raises(ValueError, match="PRM-Lite rule"):
            build_rule_params(bad)
