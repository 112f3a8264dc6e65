"""Generated artifacts: the JSON schema of an Experiment and the CRD (openAPIV3Schema from the same models)."""

from __future__ import annotations

import copy
from typing import Any

from longhaul import constants as C
from longhaul.spec.models import Experiment

# Keywords that Kubernetes structural schemas do not accept.
_DROP = {"title", "$defs", "definitions", "examples", "const", "discriminator"}


def build_json_schema() -> dict[str, Any]:
    """JSON schema (draft 2020-12) of an Experiment file, for editors and check-jsonschema."""
    schema = Experiment.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://{C.API_GROUP}/schemas/{C.API_VERSION}/experiment.json"
    return schema


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            extra = {k: v for k, v in node.items() if k != "$ref"}
            target.update(extra)
            return _inline(target, defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _structural(node: Any) -> Any:
    """Turn a pydantic JSON schema into a Kubernetes structural schema (OpenAPI v3 subset)."""
    if isinstance(node, list):
        return [_structural(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: v for k, v in node.items() if k not in _DROP}
    # Optional[X] arrives as anyOf [X, null]: keep X and mark nullable.
    if "anyOf" in node:
        variants = node.pop("anyOf")
        non_null = [v for v in variants if v.get("type") != "null"]
        nullable = len(non_null) != len(variants)
        if len(non_null) == 1:
            merged = {**non_null[0], **{k: v for k, v in node.items() if k not in ("default",)}}
            if "default" in node:
                merged["default"] = node["default"]
            node = merged
        else:
            # Unions of different shapes (e.g. list[int] | 'all'): accept any, pydantic validates.
            node = {k: v for k, v in node.items() if k in ("description", "default")}
            node["x-kubernetes-preserve-unknown-fields"] = True
        if nullable:
            node["nullable"] = True
            if node.get("default", 0) is None:
                node.pop("default")
    if node.get("default", 0) is None:
        node.pop("default")
    # JSON schema's numeric exclusive bounds → OpenAPI 3.0 (the CRD dialect): a bound plus a boolean flag.
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(flag), int | float) and not isinstance(node.get(flag), bool):
            node[bound] = node[flag]
            node[flag] = True
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    if node.get("type") == "object":
        if "properties" in node:
            node["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
        ap = node.get("additionalProperties")
        if isinstance(ap, dict):
            node["additionalProperties"] = _structural(ap)
            if node["additionalProperties"].get("x-kubernetes-preserve-unknown-fields"):
                node.pop("additionalProperties")
                node["x-kubernetes-preserve-unknown-fields"] = True
        elif ap is False:
            node.pop("additionalProperties")  # structural schemas prune unknown fields; pydantic forbids them
        elif ap is True:
            node.pop("additionalProperties")
            node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "array" and "items" in node:
        node["items"] = _structural(node["items"])
    if "propertyNames" in node:
        node.pop("propertyNames")
    return node


def build_openapi_schema() -> dict[str, Any]:
    """openAPIV3Schema for the CRD: the Experiment schema inlined and made structural, plus status."""
    raw = Experiment.model_json_schema(mode="validation")
    defs = raw.pop("$defs", {})
    schema = _structural(_inline(raw, defs))
    props = schema["properties"]
    # metadata is validated by the API server; only its name rule is ours (pydantic checks it again).
    props["metadata"] = {"type": "object"}
    props["status"] = STATUS_SCHEMA
    schema["required"] = [r for r in schema.get("required", []) if r in ("apiVersion", "kind", "spec")]
    schema["description"] = Experiment.__doc__.strip()
    return schema


_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer"},
    },
}

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Observed state, written by the operator.",
    "properties": {
        "phase": {"type": "string", "enum": ["Pending", "Queued", "Running", "Succeeded", "Failed", "Invalid"]},
        "observedGeneration": {"type": "integer"},
        "runName": {"type": "string"},
        "specHash": {"type": "string"},
        "stage": {"type": "string"},
        "jobName": {"type": "string"},
        "mlflowRunId": {"type": "string"},
        "mlflowUrl": {"type": "string"},
        "startTime": {"type": "string", "format": "date-time"},
        "completionTime": {"type": "string", "format": "date-time"},
        "lastCheckpointStep": {"type": "integer"},
        "message": {"type": "string"},
        "memoryPlan": {
            "type": "string",
            "description": "`longhaul plan` in one line: per phase the fullest GPU against its capacity.",
        },
        "conditions": {"type": "array", "items": _CONDITION},
        "seeds": {
            "type": "string",
            "description": "Multi-seed Experiments: seed runs succeeded / seed runs ('2/3'); absent otherwise.",
        },
        "seedRuns": {
            "type": "array",
            "description": "Multi-seed Experiments: one entry per seed run (one stage chain each), in seed order.",
            "items": {
                "type": "object",
                "required": ["seed", "runName", "phase"],
                "properties": {
                    "seed": {"type": "integer"},
                    "runName": {"type": "string"},
                    "phase": {"type": "string", "enum": ["Pending", "Queued", "Running", "Succeeded", "Failed"]},
                    "stage": {"type": "string"},
                    "jobName": {"type": "string"},
                    "message": {"type": "string"},
                    "startTime": {"type": "string", "format": "date-time"},
                    "completionTime": {"type": "string", "format": "date-time"},
                    "lastCheckpointStep": {"type": "integer"},
                    "mlflowRunId": {"type": "string"},
                    "mlflowUrl": {"type": "string"},
                },
            },
        },
        "history": {
            "type": "array",
            "maxItems": C.STATUS_HISTORY_LIMIT,
            "description": f"The runs this Experiment had, newest last (at most {C.STATUS_HISTORY_LIMIT}; `longhaul "
            "history NAME`): a new entry each time the status names another run (the spec changed).",
            "items": {
                "type": "object",
                "required": ["runName", "specHash", "phase"],
                "properties": {
                    "runName": {"type": "string"},
                    "specHash": {"type": "string"},
                    "phase": {
                        "type": "string",
                        "enum": ["Pending", "Queued", "Running", "Succeeded", "Failed", "Superseded"],
                        "description": "Superseded: stopped for a spec edit under the annotation "
                        "longhaul.dev/on-spec-change: new-run.",
                    },
                    "gitCommit": {
                        "type": "string",
                        "description": "Annotation longhaul.dev/git-commit when the run's entry was made.",
                    },
                    "mlflowRunId": {"type": "string"},
                    "startTime": {"type": "string", "format": "date-time"},
                    "completionTime": {"type": "string", "format": "date-time"},
                },
            },
        },
    },
    "x-kubernetes-preserve-unknown-fields": True,
}


def build_crd() -> dict[str, Any]:
    """The Experiment CustomResourceDefinition (apiextensions.k8s.io/v1)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{C.PLURAL}.{C.API_GROUP}",
            "labels": {"app.kubernetes.io/name": C.APP_NAME, "app.kubernetes.io/part-of": C.APP_NAME},
        },
        "spec": {
            "group": C.API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": C.KIND,
                "listKind": f"{C.KIND}List",
                "plural": C.PLURAL,
                "singular": C.SINGULAR,
                "shortNames": list(C.SHORT_NAMES),
                "categories": list(C.CATEGORIES),
            },
            "versions": [
                {
                    "name": C.API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Seeds",
                            "type": "string",
                            "jsonPath": ".status.seeds",
                            "description": "Seed runs succeeded / seed runs (multi-seed Experiments only)",
                        },
                        {"name": "Run", "type": "string", "jsonPath": ".status.runName"},
                        {"name": "Stage", "type": "string", "jsonPath": ".status.stage", "priority": 1},
                        {"name": "MLflow", "type": "string", "jsonPath": ".status.mlflowUrl"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": build_openapi_schema()},
                }
            ],
        },
    }
