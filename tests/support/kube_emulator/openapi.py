"""OpenAPI v3 documents: enough for kubectl to validate server-side (`fieldValidation`) and to `explain` CRDs.

kubectl decides whether the server supports `fieldValidation=Strict` by finding, in the group-version's OpenAPI
v3 document, a PATCH operation tagged with the kind's `x-kubernetes-group-version-kind` whose path declares the
`fieldValidation` query parameter. CRD schemas are published under `components.schemas` so that
`kubectl explain experiment.spec` prints the field descriptions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

_PARAMS = [
    {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    for n in ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")
]


def _gv_key(t: Any) -> str:
    return f"apis/{t.group}/{t.version}" if t.group else "api/v1"


def openapi_v3_index(types: Iterable[Any]) -> dict[str, Any]:
    types = list(types)
    paths = {}
    for key in sorted({_gv_key(t) for t in types}):
        doc = openapi_v3_doc(types, key)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16].upper()
        paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
    return {"paths": paths}


def _schema_name(t: Any) -> str:
    group = ".".join(reversed(t.group.split("."))) if t.group else "io.k8s.api.core"
    return f"{group}.{t.version}.{t.kind}"


def openapi_v3_doc(types: Iterable[Any], gv_key: str) -> dict[str, Any] | None:
    selected = [t for t in types if _gv_key(t) == gv_key]
    if not selected:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for t in selected:
        gvk = {"group": t.group, "version": t.version, "kind": t.kind}
        base = f"/{gv_key}/namespaces/{{namespace}}/{t.plural}" if t.namespaced else f"/{gv_key}/{t.plural}"
        # kubectl looks for the parameter on the PATCH operation itself.
        op = {
            "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": _PARAMS,
            "responses": {"200": {"description": "OK"}},
        }
        paths[f"{base}/{{name}}"] = {"parameters": _PARAMS, "patch": op, "put": {**op, "x-kubernetes-action": "put"}}
        paths[base] = {"parameters": _PARAMS, "post": {**op, "x-kubernetes-action": "post"}}
        if t.crd_schema is not None:
            schemas[_schema_name(t)] = {**t.crd_schema, "x-kubernetes-group-version-kind": [gvk]}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
