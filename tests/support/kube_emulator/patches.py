"""Patch semantics: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge (approximated)."""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


class PatchError(ValueError):
    pass


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strip_directives(patch: Any) -> Any:
    """Drop strategic-merge directives (`$patch`, `$setElementOrder/…`, `$retainKeys`, `$deleteFromPrimitiveList`).

    Without per-field merge keys the emulator treats a strategic merge patch as a merge patch: lists are
    replaced, not merged by key. kubectl sends whole lists for the fields it manages, so this rarely matters.
    """
    if isinstance(patch, dict):
        return {k: strip_directives(v) for k, v in patch.items() if not k.startswith("$")}
    if isinstance(patch, list):
        return [strip_directives(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    return patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    return cur, parts[-1]


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/remove/replace/move/copy/test."""
    doc = copy.deepcopy(target)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":
                parent, last = _walk(doc, parts)
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != op.get("value"):
                    raise PatchError(f"test operation failed at {op['path']}")
                continue
            if kind in ("move", "copy"):
                src_parent, src_last = _walk(doc, _pointer(op["from"]))
                value = src_parent[int(src_last)] if isinstance(src_parent, list) else src_parent[src_last]
                value = copy.deepcopy(value)
                if kind == "move":
                    doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
                doc = json_patch(doc, [{"op": "add", "path": op["path"], "value": value}])
                continue
            if not parts:
                doc = copy.deepcopy(op.get("value"))
                continue
            parent, last = _walk(doc, parts)
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "add":
                    parent.insert(index, copy.deepcopy(op["value"]))
                elif kind == "remove":
                    parent.pop(index)
                elif kind == "replace":
                    parent[index] = copy.deepcopy(op["value"])
                else:
                    raise PatchError(f"unknown op {kind!r}")
            else:
                if kind == "add":
                    parent[last] = copy.deepcopy(op["value"])
                elif kind == "remove":
                    del parent[last]
                elif kind == "replace":
                    if last not in parent:
                        raise PatchError(f"replace: missing path {op['path']}")
                    parent[last] = copy.deepcopy(op["value"])
                else:
                    raise PatchError(f"unknown op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            if isinstance(exc, PatchError):
                raise
            raise PatchError(f"{kind} {op.get('path')}: {exc!r}") from exc
    return doc
