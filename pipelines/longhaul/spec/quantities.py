"""Kubernetes quantities and Slurm time limits of the spec, checked for their meaning after their form (pure).

The form is the field's pattern (`QUANTITY`, `TIME_LIMIT` in `longhaul.spec.resources`); here the value:
`memory: "0"` would render a zero request (Slurm reads `--mem=0` as *all* of a node's memory), `"00:00:00"` or
`"1:75:00"` a time limit no scheduler accepts, `99999999Ti` a request no node has.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

#: Bytes per unit of a Kubernetes quantity (binary and decimal suffixes; none = bytes).
UNITS: dict[str, int] = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
}
#: The largest memory or shared-memory size of one node: 1024Ti.
MAX_QUANTITY = 1024 * UNITS["Ti"]
#: The longest time limit: 365 days.
MAX_TIME_LIMIT_S = 365 * 86_400

_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|K|M|G|T)?")
_TIME = re.compile(r"(?:(\d+)-)?(\d{1,3}):(\d{2}):(\d{2})")


def quantity_bytes(value: str) -> int:
    """The bytes of a quantity such as `256Gi`, `8G` or `1048576` (rounded down); ValueError for another form."""
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a quantity like 256Gi or 64G")
    try:
        return int(Decimal(m.group(1)) * UNITS[m.group(2) or ""])
    except InvalidOperation:  # pragma: no cover - the pattern admits only plain decimals
        raise ValueError(f"{value!r} is not a quantity like 256Gi or 64G") from None


def check_quantity(*, minimum: str) -> Callable[[str], str]:
    """A validator: the quantity lies between `minimum` and `MAX_QUANTITY` (1024Ti)."""
    low = quantity_bytes(minimum)

    def check(value: str) -> str:
        size = quantity_bytes(value)
        if size < low:
            raise ValueError(f"less than {minimum}; write a size such as 8Gi or 256Gi")
        if size > MAX_QUANTITY:
            raise ValueError("more than 1024Ti, more than any node has; write a size such as 256Gi")
        return value

    return check


def time_limit_seconds(value: str) -> int:
    """The seconds of a `[D-]HH:MM:SS` time limit; ValueError for another form."""
    m = _TIME.fullmatch(value)
    if not m:
        raise ValueError(f"{value!r} is not a time limit like 3-00:00:00 or 12:00:00")
    days, hours, minutes, seconds = (int(x or 0) for x in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def check_time_limit(value: str) -> str:
    """A validator: minutes and seconds below 60, more than zero, at most 365 days."""
    m = _TIME.fullmatch(value)
    if m and (int(m.group(3)) >= 60 or int(m.group(4)) >= 60):
        raise ValueError("minutes and seconds must be below 60; write [D-]HH:MM:SS, e.g. 1-12:30:00")
    total = time_limit_seconds(value)
    if total == 0:
        raise ValueError("a time limit of zero ends the job before it starts; write e.g. 12:00:00")
    if total > MAX_TIME_LIMIT_S:
        raise ValueError("more than 365 days; write e.g. 3-00:00:00")
    return value
