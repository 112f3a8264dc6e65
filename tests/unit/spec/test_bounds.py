"""Every number of the spec is finite and bounded (issue 30, class 1), held over the JSON schema so that a new
field is covered without touching this file; quantities and time limits are checked for their meaning."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from longhaul.spec import SpecError
from longhaul.spec.bounds import DOMAIN_TASKS
from longhaul.spec.load import build_experiment
from longhaul.spec.models import Experiment
from longhaul.spec.quantities import quantity_bytes, time_limit_seconds

SMOKE = yaml.safe_load((Path(__file__).resolve().parents[3] / "specs" / "smoke.yaml").read_text(encoding="utf-8"))


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    if "$ref" in node:
        return _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in node:
        return [alt for sub in node["anyOf"] for alt in _resolve(sub, defs)]
    return [node]


def number_fields() -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every integer and float of an Experiment (list items as `path[]`)."""
    schema = Experiment.model_json_schema(mode="validation")
    defs = schema["$defs"]
    out: list[tuple[str, dict[str, Any]]] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for alt in _resolve(node, defs):
            if alt.get("type") in ("integer", "number"):
                out.append((path, alt))
            for key, sub in alt.get("properties", {}).items():
                walk(sub, f"{path}.{key}" if path else key)
            if isinstance(alt.get("items"), dict):
                walk(alt["items"], path + "[]")
            if isinstance(alt.get("additionalProperties"), dict):
                walk(alt["additionalProperties"], path + "{}")

    walk(schema, "")
    return out


NUMBERS = number_fields()


def test_every_number_of_the_spec_has_a_lowest_and_a_highest_value() -> None:
    assert len(NUMBERS) > 60  # the walk reaches the nested models, list items and PRM-Lite's parameters
    unbounded = [
        p
        for p, s in NUMBERS
        if not ({"minimum", "exclusiveMinimum"} & s.keys() and {"maximum", "exclusiveMaximum"} & s.keys())
    ]
    assert not unbounded, f"numbers without both bounds: {unbounded}"
    assert "spec.reward.rules.aggregate.clip" in dict(NUMBERS)


def _doc_with(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SMOKE)
    keys = path.split(".")
    node = doc
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    last = keys[-1]
    if last.endswith("[]"):
        node[last[:-2]] = [value]
    else:
        node[last] = value
    return doc


SETTABLE = [(p, s) for p, s in NUMBERS if "{}" not in p and p.count("[]") <= 1 and (p.endswith("[]") or "[]" not in p)]


@pytest.mark.parametrize(("path", "schema"), SETTABLE, ids=[p for p, _ in SETTABLE])
def test_non_finite_and_out_of_range_values_are_refused_with_the_field_named(path: str, schema: dict) -> None:
    field = path.removesuffix("[]")
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    too_big = high + 1 if schema["type"] == "integer" else high * 2 + 1
    bad = [too_big, float("nan"), float("inf")] + ([2.5] if schema["type"] == "integer" else [])
    for value in bad:
        with pytest.raises(SpecError) as info:
            build_experiment(_doc_with(path, value), "numbers.yaml")
        named = [p for p in info.value.problems if p.path.startswith(field)]
        assert named, (path, value, [p.render() for p in info.value.problems])
        text = named[0].render()
        assert "write a" in text or "finite" in text, text  # the fix: the range to write


def test_the_domain_task_count_is_the_task_files() -> None:
    from longhaul.envs.airline.tasks import load_tasks

    assert sorted(int(t) for t in load_tasks()) == list(range(DOMAIN_TASKS["airline"]))


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("memory", "0", "less than 1Gi"),
        ("memory", "0.5Gi", "less than 1Gi"),
        ("memory", "99999999Ti", "more than 1024Ti"),
        ("shm_size", "0", "less than 1Mi"),
        ("time_limit", "00:00:00", "zero"),
        ("time_limit", "1:75:00", "below 60"),
        ("time_limit", "400-00:00:00", "365 days"),
    ],
)
def test_quantities_and_time_limits_are_checked_for_their_meaning(field: str, value: str, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        build_experiment(_doc_with(f"spec.resources.{field}", value), "resources.yaml")
    (p,) = [p for p in info.value.problems if p.path == f"spec.resources.{field}"]
    assert fragment in p.message


def test_quantity_and_time_arithmetic() -> None:
    assert quantity_bytes("1Gi") == 2**30 and quantity_bytes("8G") == 8 * 10**9 and quantity_bytes("1.5Ki") == 1536
    assert time_limit_seconds("1-02:03:04") == 93784 and time_limit_seconds("00:30:00") == 1800
    exp = build_experiment(_doc_with("spec.resources.time_limit", "365-00:00:00"), "ok.yaml")
    assert exp.spec.resources.time_limit == "365-00:00:00"
