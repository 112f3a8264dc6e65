"""PRM-Lite's input: the action history of a trajectory (method.md a.1), with the entities its observations name.

One entry per executed tool call, plus `implicit_think` pseudo-entries for long messages to the user; calls to
unknown tools and unparsable calls are only counted (`HistoryStats`). Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from longhaul.rewards.prm_lite_settings import DEFAULT_PARAMS, RuleParams

IMPLICIT_THINK = "implicit_think"

ENTITY_PATTERNS: Mapping[str, re.Pattern[str]] = MappingProxyType(
    {
        "reservation_id": re.compile(r"\b[A-Z0-9]{6}\b"),
        "user_id": re.compile(r"\b[a-z]+_[a-z]+_[0-9]+\b"),
        "payment_id": re.compile(r"\b(?:credit_card|gift_card|certificate)_[0-9]+\b"),
        "flight_number": re.compile(r"\b[A-Z]{3}[0-9]{3}\b"),
        "date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    }
)


def canonical_param_str(params: Mapping[str, Any]) -> str:
    """The original's signature of a call's arguments: sorted-key JSON, lower-cased."""
    return json.dumps(params, sort_keys=True, ensure_ascii=False).lower()


#: One pass over the observation. Every entity is a whole word run (dates: three runs joined by '-'), so this
#: finds exactly what the five separate findall passes find; a string that fits two kinds (a flight number is
#: also a valid reservation id, a payment id also a valid user id) is listed under both, as there.
_ENTITY_SCAN = re.compile(
    r"\b(?:(?P<payment_id>(?:credit_card|gift_card|certificate)_[0-9]+)|(?P<user_id>[a-z]+_[a-z]+_[0-9]+)"
    r"|(?P<reservation_id>[A-Z0-9]{6})|(?P<date>\d{4}-\d{2}-\d{2}))\b"
)
_FLIGHT = re.compile(r"[A-Z]{3}[0-9]{3}")
_ALSO_USER = re.compile(r"[a-z]+_[a-z]+_[0-9]+")


def extract_entities(observation: str) -> dict[str, tuple[str, ...]]:
    """Entity strings in a tool observation, by kind (never run on user messages)."""
    found: dict[str, list[str]] = {}
    for m in _ENTITY_SCAN.finditer(observation):
        kind, text = m.lastgroup, m.group()
        found.setdefault(kind, []).append(text)
        if kind == "reservation_id" and _FLIGHT.fullmatch(text):
            found.setdefault("flight_number", []).append(text)
        elif kind == "payment_id":
            found.setdefault("user_id", []).append(text)
    return {k: tuple(v) for k, v in found.items()}


@dataclass(frozen=True)
class ActionEntry:
    """One entry of the action history. `turn` is the index of the assistant turn it came from (-1 if unknown);
    `call` the index of the call inside that turn."""

    tool: str
    params: Mapping[str, Any] = field(default_factory=dict)
    is_error: bool = False
    entities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    content: str = ""
    turn: int = -1
    call: int = 0
    param_str: str | None = None  # None = canonical_param_str(params); the original tests stored other strings
    #: Call signature for the redundancy / error-repetition rules, computed once from this entry alone (like the
    #: original's stored param_str): (tool, `param_str`, else the lower-cased sorted-key JSON of the arguments).
    key: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ps = self.param_str if self.param_str is not None else canonical_param_str(self.params)
        object.__setattr__(self, "key", (self.tool, ps))

    @property
    def signature(self) -> tuple[str, str]:
        return self.key


@dataclass(frozen=True)
class HistoryStats:
    """Tool calls that never reached the history (method.md h.16)."""

    num_unknown_tool_calls: int = 0
    num_unparsed_tool_calls: int = 0


def build_action_history(
    trajectory: Any, params: RuleParams = DEFAULT_PARAMS, *, seed_compat: bool = False
) -> tuple[list[ActionEntry], HistoryStats]:
    """The action history of a `longhaul.envs.trajectory.Trajectory` (or its dict form), as method.md a.1.

    Executed calls (known tool, arguments parsed to an object) become entries, in order; an error observation
    sets `is_error` and skips entity extraction. A message to the user longer than `implicit_think.min_chars`
    becomes an `implicit_think` entry holding its first `keep_chars` characters, unless the previous entry is an
    identical implicit_think. Calls to unknown tools and unparsable calls are only counted. With `seed_compat`
    tool-call entries carry no assistant text: the original's production history never had it (so P9 never
    fired there).
    """
    turns = trajectory["turns"] if isinstance(trajectory, Mapping) else trajectory.turns
    min_chars = params.get("implicit_think", "min_chars")
    keep = int(params.get("implicit_think", "keep_chars"))
    history: list[ActionEntry] = []
    unknown = unparsed = 0
    for turn in turns:
        t = _as_mapping(turn)
        content = t.get("content") or ""
        call_content = "" if seed_compat else content
        calls = t.get("tool_calls") or []
        for ci, call in enumerate(calls):
            c = _as_mapping(call)
            args = c.get("arguments")
            if c.get("parse_error") is not None or not isinstance(args, Mapping):
                unparsed += 1
                continue
            if not c.get("known_tool", True):
                unknown += 1
                continue
            err = bool(c.get("is_error", False))
            obs = c.get("result") or ""
            history.append(
                ActionEntry(
                    tool=c["name"],
                    params=dict(args),
                    is_error=err,
                    entities={} if err else extract_entities(obs),
                    content=call_content,
                    turn=int(t["index"]),
                    call=ci,
                )
            )
        if not calls and t.get("to_user") and len(content) > min_chars and params.enabled("implicit_think"):
            text = content[:keep]
            last = history[-1] if history else None
            if last is None or last.tool != IMPLICIT_THINK or last.content != text:
                history.append(
                    ActionEntry(tool=IMPLICIT_THINK, params={}, content=text, turn=int(t["index"]), param_str="")
                )
    return history, HistoryStats(unknown, unparsed)


def _as_mapping(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, Mapping):
        return obj
    return obj.__dict__ if hasattr(obj, "__dict__") else {f: getattr(obj, f) for f in obj.__dataclass_fields__}
