"""What PRM-Lite's rules recognise (method.md a.1, pure): the tool classes, the identifier formats and the
placeholder vocabulary, and the placeholder check itself (`seed_compat`: the original's substring quirks; default:
whole words of short values, identifiers checked by parameter name; see `longhaul.rewards.prm_lite`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any

SEED_READ_TOOLS = frozenset(
    {
        "list_all_airports",
        "search_direct_flight",
        "search_onestop_flight",
        "get_user_details",
        "get_reservation_details",
        "calculate",
    }
)
READ_TOOLS = SEED_READ_TOOLS | {"get_flight_status"}
ESCALATION_TOOLS = frozenset({"transfer_to_human_agents"})
THINK_TOOLS = frozenset({"think", "implicit_think"})

#: Identifier parameters and the values they must match (checked in this order, as in the original).
SCHEMA_PATTERNS: Mapping[str, re.Pattern[str]] = MappingProxyType(
    {
        "reservation_id": re.compile(r"^[A-Z0-9]{6}$"),
        "user_id": re.compile(r"^[a-z]+_[a-z]+_[0-9]+$"),
        "payment_id": re.compile(r"^(credit_card|gift_card|certificate)_[0-9]+$"),
        "flight_number": re.compile(r"^[A-Z]{3}[0-9]{3}$"),
        "origin": re.compile(r"^[A-Z]{3}$"),
        "destination": re.compile(r"^[A-Z]{3}$"),
        "date": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    }
)

PLACEHOLDER_KEYWORDS = frozenset(
    {
        "previous",
        "unknown",
        "placeholder",
        "none",
        "null",
        "n/a",
        "any",
        "some",
        "first",
        "last",
        "default",
        "example",
        "sample",
        "test",
        "dummy",
        "temp",
        "temporary",
    }
)
_WORD = re.compile(r"[a-z0-9]+(?:/[a-z0-9]+)?")
_MAX_PLACEHOLDER_WORDS = 4


@lru_cache(maxsize=65536)
def _is_placeholder_value(name: str, value: str, seed_compat: bool) -> bool:
    lower = value.lower()
    if seed_compat:
        if any(kw in lower for kw in PLACEHOLDER_KEYWORDS):
            return True
        lname = name.lower()
        for key, pat in SCHEMA_PATTERNS.items():
            if key in lname:
                return not pat.match(value)  # the original's check, quirk included: `$` lets a trailing newline by
        return False
    words = _WORD.findall(lower.replace("_", " "))
    if len(words) <= _MAX_PLACEHOLDER_WORDS and any(w in PLACEHOLDER_KEYWORDS for w in words):
        return True
    lname = name.lower()
    for key, pat in SCHEMA_PATTERNS.items():
        if lname == key or lname.endswith("_" + key):
            return not pat.fullmatch(value)
    return False


def has_placeholder(params: Mapping[str, Any], seed_compat: bool = False) -> bool:
    """True if any top-level string argument is a placeholder (nested lists are not checked)."""
    for k, v in params.items():
        if isinstance(v, str) and _is_placeholder_value(k, v, seed_compat):
            return True
    return False
