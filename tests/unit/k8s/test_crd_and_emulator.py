"""The chart's CRD equals the generated one; the test API server's schema, selector and patch semantics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from longhaul.commands.spec import dump_yaml
from longhaul.spec import load_spec
from longhaul.spec.export import build_crd

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests/support"))

from kube_emulator import patches, schema, selectors  # noqa: E402

CRD_FILE = ROOT / "charts/longhaul/crds/experiments.longhaul.dev.yaml"


def test_chart_crd_is_the_generated_one() -> None:
    assert CRD_FILE.read_text() == dump_yaml(build_crd()), (
        "charts/longhaul/crds is stale: run `longhaul crd -o charts/longhaul/crds/experiments.longhaul.dev.yaml`"
    )


def _openapi() -> dict:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_crd_uses_openapi_3_0_exclusive_bounds() -> None:
    def walk(node: object) -> None:
        if isinstance(node, dict):
            for flag in ("exclusiveMinimum", "exclusiveMaximum"):
                if flag in node:
                    assert node[flag] is True, f"{flag} must be boolean in a CRD, got {node[flag]!r}"
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(_openapi())


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_spec_passes_the_crd_schema_with_defaults(spec: Path) -> None:
    doc = yaml.safe_load(spec.read_text())
    assert schema.prune(doc, _openapi()) == []
    schema.default(doc, _openapi())
    assert schema.validate(doc, _openapi()) == []
    # API-server defaulting fills what pydantic would: the model accepts the defaulted object unchanged.
    assert load_spec(spec).spec.algorithm.clip_ratio == doc["spec"]["algorithm"]["clip_ratio"]


def test_schema_errors_are_k8s_style_and_unknown_fields_pruned() -> None:
    doc = yaml.safe_load((ROOT / "specs/prm_lite_lata.yaml").read_text())
    doc["spec"]["algorithm"]["group_size"] = 0
    doc["spec"]["algorithm"]["bogus"] = 1
    assert schema.prune(doc, _openapi()) == ["spec.algorithm.bogus"]
    problems = schema.validate(doc, _openapi())
    assert ("spec.algorithm.group_size", "Invalid value: 0: 0 is less than the minimum of 2") in problems


def test_nullable_fields_accept_null() -> None:
    doc = yaml.safe_load((ROOT / "specs/prm_lite_lata.yaml").read_text())
    assert doc["spec"]["environment"]["tool_output_limit"] is None
    schema.default(doc, _openapi())
    assert schema.validate(doc, _openapi()) == []


@pytest.mark.parametrize(
    ("selector", "labels", "match"),
    [
        ("a=b", {"a": "b"}, True),
        ("a=b,c!=d", {"a": "b", "c": "d"}, False),
        ("a in (x, y),!z", {"a": "y"}, True),
        ("a notin (x)", {"a": "x"}, False),
        ("a", {}, False),
        ("a==b", {"a": "b"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict, match: bool) -> None:
    assert selectors.parse_label_selector(selector)({"metadata": {"labels": labels}}) is match


def test_field_selectors() -> None:
    obj = {"metadata": {"name": "x", "namespace": "n"}, "involvedObject": {"name": "e"}}
    assert selectors.parse_field_selector("metadata.name=x,involvedObject.name=e")(obj)
    assert not selectors.parse_field_selector("metadata.namespace!=n")(obj)
    with pytest.raises(ValueError):
        selectors.parse_label_selector("a in (x")


def test_patches() -> None:
    assert patches.merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {
        "a": {"c": 2},
        "l": [2],
    }
    doc = {"metadata": {"resourceVersion": "1"}, "l": [1, 2]}
    assert patches.json_patch(
        doc,
        [
            {"op": "add", "path": "/l/-", "value": 3},
            {"op": "replace", "path": "/metadata/resourceVersion", "value": "2"},
        ],
    ) == {"metadata": {"resourceVersion": "2"}, "l": [1, 2, 3]}
    with pytest.raises(patches.PatchError):
        patches.json_patch(doc, [{"op": "test", "path": "/metadata/resourceVersion", "value": "9"}])
    assert patches.strip_directives({"$setElementOrder/containers": [], "spec": {"$retainKeys": [], "x": 1}}) == {
        "spec": {"x": 1}
    }


def test_preferred_api_version_follows_kubernetes_priority() -> None:
    from kube_emulator import server

    versions = ["v1alpha1", "v1", "v1beta1", "v2", "v1beta2", "v10"]
    assert sorted(versions, key=server._version_priority) == ["v10", "v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]
