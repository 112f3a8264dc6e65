"""Wording of the spec loader's errors that pydantic words for programmers (pure).

`number_problem` turns pydantic's number errors ("Input should be less than or equal to 4096") into what a user
needs: what is wrong and the range to write, read from the field's own JSON schema (so the bounds are stated
where they are defined, `longhaul.spec.bounds`). `strip_union_tags` removes the names pydantic gives union
members from an error's location, walking the user's own document so that no key the user wrote is ever taken
for one (a key named `strange` or `int_x` is reported, not dropped).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from longhaul.spec.models import Experiment

#: Pydantic's names of union members in error locations: `list[constrained-int]`, `literal['all','last']`, `int`,
#: `function-after[…]`, a model's class name (`SFTSpec`); and `[key]`, where a mapping's key failed.
_UNION_TAG = re.compile(
    r"(\[key\]|str|int|float|bool|none|bytes|[a-z-]+\[.*\]|constrained-[a-z-]+|function-[a-z-]+.*|[A-Z][A-Za-z0-9]*)",
    re.DOTALL,
)

#: What each of pydantic's number errors means to a user.
_NUMBER_REASONS = {
    "finite_number": "not a finite number (.nan and .inf are refused)",
    "greater_than": "too small",
    "greater_than_equal": "too small",
    "less_than": "too large",
    "less_than_equal": "too large",
    "int_from_float": "not a whole number",
    "int_parsing_size": "too large",
    "int_type": "not a whole number",
    "int_parsing": "not a whole number",
    "float_type": "not a number",
    "float_parsing": "not a number",
}


def strip_union_tags(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """`loc` without pydantic's union-member names: a part that is a key or index of the user's document at that
    point is kept; any other part is dropped only when it has the form of such a name."""
    out: list[Any] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            out.append(part)
            cur = cur[part]
        elif isinstance(part, str) and _UNION_TAG.fullmatch(part):
            continue
        else:  # a field the document lacks (a missing value)
            out.append(part)
            cur = None
    return tuple(out)


@functools.cache
def _schema() -> dict[str, Any]:
    return Experiment.model_json_schema(mode="validation")


def _resolve(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a schema node stands for ($ref followed, anyOf/allOf flattened)."""
    if "$ref" in node:
        return _resolve(_schema()["$defs"][node["$ref"].rsplit("/", 1)[-1]])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            return [alt for sub in node[key] for alt in _resolve(sub)]
    return [node]


def _number_schema(loc: tuple[Any, ...]) -> dict[str, Any] | None:
    nodes = [_schema()]
    for part in loc:
        nxt = []
        for node in (alt for n in nodes for alt in _resolve(n)):
            if isinstance(part, int) and "items" in node:
                nxt.append(node["items"])
            elif isinstance(part, str) and part in node.get("properties", {}):
                nxt.append(node["properties"][part])
            elif isinstance(part, str) and isinstance(node.get("additionalProperties"), dict):
                nxt.append(node["additionalProperties"])
        if not nxt:
            return None
        nodes = nxt
    found = [alt for n in nodes for alt in _resolve(n) if alt.get("type") in ("integer", "number")]
    return found[0] if found else None


def number_range(loc: tuple[Any, ...]) -> str | None:
    """'a whole number from 1 to 4096' for the number field at `loc`; None when `loc` is not a number field."""
    node = _number_schema(loc)
    if node is None:
        return None
    kind = "a whole number" if node["type"] == "integer" else "a number"
    low_open, high_open = "exclusiveMinimum" in node, "exclusiveMaximum" in node
    low, high = node.get("exclusiveMinimum", node.get("minimum")), node.get("exclusiveMaximum", node.get("maximum"))
    if low is None or high is None:
        return kind
    low_word = f"above {_num(low)}" if low_open else f"from {_num(low)}"
    high_word = (" and below " if low_open else ", below ") if high_open else (", up to " if low_open else " to ")
    return f"{kind} {low_word}{high_word}{_num(high)}"


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def number_problem(kind: str, loc: tuple[Any, ...]) -> tuple[str, str] | None:
    """(message, hint) for one of pydantic's number errors at `loc`; None for any other error."""
    reason = _NUMBER_REASONS.get(kind)
    if reason is None:
        return None
    wanted = number_range(loc)
    return reason, f"write {wanted}" if wanted else "write a number"
