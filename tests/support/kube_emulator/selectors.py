"""Label and field selectors as kube-apiserver parses them (`a=b,c!=d,e in (x,y),!f,g`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Predicate = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


def _split(selector: str) -> list[str]:
    # Commas inside `in (a,b)` do not separate requirements.
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(selector: str | None) -> Predicate:
    """A predicate on an object's `metadata.labels`; raises ValueError on syntax errors."""
    if not selector:
        return lambda obj: True
    reqs: list[Predicate] = []
    for part in _split(selector):
        m = _EQ.match(part)
        if m:
            key, op, value = m.groups()
            if op == "!=":
                reqs.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                reqs.append(lambda labels, k=key, v=value: labels.get(k) == v)
            continue
        m = _SET.match(part)
        if not m:
            raise ValueError(f"unable to parse requirement: {part.strip()!r}")
        neg, key, op, values = m.groups()
        if op:
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                reqs.append(lambda labels, k=key, a=allowed: labels.get(k) in a)
            else:
                reqs.append(lambda labels, k=key, a=allowed: labels.get(k) not in a)
        elif neg:
            reqs.append(lambda labels, k=key: k not in labels)
        else:
            reqs.append(lambda labels, k=key: k in labels)
    return lambda obj: all(r((obj.get("metadata") or {}).get("labels") or {}) for r in reqs)


def _field(obj: dict[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def parse_field_selector(selector: str | None) -> Predicate:
    """A predicate for `metadata.name=x`, `metadata.namespace!=y`, `status.phase=Running` (any dotted field)."""
    if not selector:
        return lambda obj: True
    reqs: list[Predicate] = []
    for part in _split(selector):
        m = _EQ.match(part)
        if not m:
            raise ValueError(f"invalid field selector: {part.strip()!r}")
        path, op, value = m.groups()
        if op == "!=":
            reqs.append(lambda obj, p=path, v=value: str(_field(obj, p) or "") != v)
        else:
            reqs.append(lambda obj, p=path, v=value: str(_field(obj, p) or "") == v)
    return lambda obj: all(r(obj) for r in reqs)
