"""CRD structural-schema semantics: defaulting, pruning and validation of custom objects (like kube-apiserver).

kube-apiserver order for a custom object write: prune unknown fields → apply defaults → validate against the
version's openAPIV3Schema. Errors are reported k8s-style: `spec.algorithm.group_size: Invalid value: 0: …`.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

_ALWAYS_KEPT = {"apiVersion", "kind", "metadata"}


def _preserves(schema: dict[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def prune(obj: Any, schema: dict[str, Any], path: str = "", top: bool = True) -> list[str]:
    """Drop fields the schema does not declare (in place); returns their dotted paths (for fieldValidation)."""
    dropped: list[str] = []
    if isinstance(obj, dict) and schema.get("type", "object") == "object" and not _preserves(schema):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        for key in list(obj):
            if top and key in _ALWAYS_KEPT:
                continue
            sub = f"{path}.{key}" if path else key
            if props is not None and key in props:
                dropped += prune(obj[key], props[key], sub, top=False)
            elif isinstance(addl, dict):
                dropped += prune(obj[key], addl, sub, top=False)
            elif props is not None or addl is None:
                del obj[key]
                dropped.append(sub)
    elif isinstance(obj, dict) and _preserves(schema):
        for key, sub_schema in (schema.get("properties") or {}).items():
            if key in obj:
                dropped += prune(obj[key], sub_schema, f"{path}.{key}" if path else key, top=False)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            dropped += prune(item, schema["items"], f"{path}[{i}]", top=False)
    return dropped


def default(obj: Any, schema: dict[str, Any]) -> None:
    """Fill `default`s of absent properties (in place), recursing into present objects and arrays."""
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj and obj[key] is None and not sub.get("nullable"):
                del obj[key]  # null for a non-nullable field is pruned, then defaulted
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                default(obj[key], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for value in obj.values():
                default(value, addl)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            default(item, schema["items"])


def to_draft4(schema: Any) -> Any:
    """OpenAPI v3 (as used by CRDs) → JSON schema draft 4: `nullable` becomes a `null` type alternative."""
    if isinstance(schema, list):
        return [to_draft4(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: to_draft4(v) for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if schema.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}


def _validator(schema: dict[str, Any]) -> Any:
    # One compiled validator per schema object (CRD schemas are replaced, not mutated, on CRD updates).
    hit = _VALIDATORS.get(id(schema))
    if hit is None or hit[0] is not schema:
        draft4 = to_draft4(schema)
        draft4["$schema"] = "http://json-schema.org/draft-04/schema#"
        hit = (schema, jsonschema.Draft4Validator(draft4))
        _VALIDATORS[id(schema)] = hit
    return hit[1]


def _dotted(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def validate(obj: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    """All schema violations of `obj` as (field, k8s-style message `Invalid value: <value>: <reason>`), sorted."""
    validator = _validator(schema)
    problems = []
    for err in validator.iter_errors(obj):
        field = _dotted(err.absolute_path) or "<root>"
        if err.validator == "required":
            problems.append((field, f"Required value: {err.message}"))
        elif err.validator == "enum":
            problems.append((field, f"Unsupported value: {err.instance!r}: supported values: {err.validator_value}"))
        else:
            problems.append((field, f"Invalid value: {_short(err.instance)}: {err.message}"))
    return sorted(set(problems))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
