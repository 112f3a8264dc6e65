"""Type checks of trajectory records read back from files (pure): the episode runner's JSON (`Trajectory.to_dict`)
as `longhaul explain` and the PRM-Lite rules read it.

A record is checked before anything is computed from it, so a wrong type is one line naming the file, the record
and the dotted field (`turns[3].tool_calls[0].name: must be a string`), never a traceback from deep inside the
rules; and its size is bounded: at most `MAX_TURNS` turns (the spec's own limit on `environment.max_turns`) and
`MAX_TOKENS` completion tokens, so one record cannot make the token layout take unbounded time or memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from longhaul.spec.bounds import MAX_STEPS, MAX_TOKENS, MAX_TURNS

#: field -> (allowed types, required). `float` takes an int too; `bool` is never an int; None is allowed when
#: the field is optional.
_Fields = Mapping[str, tuple[tuple[type, ...], bool]]

TRAJECTORY_FIELDS: _Fields = {
    "task_id": ((str, int), False),
    "trial": ((int,), False),
    "termination": ((str,), False),
    "grade": ((dict,), False),
    "turns": ((list,), True),
}
TURN_FIELDS: _Fields = {
    "index": ((int,), True),
    "content": ((str,), False),
    "to_user": ((bool,), False),
    "completion_tokens": ((int,), False),
    "tool_calls": ((list,), False),
    "finish_reason": ((str,), False),
    "policy_version": ((list,), False),
}
CALL_FIELDS: _Fields = {
    "name": ((str,), True),
    "arguments": ((dict,), False),
    "raw_arguments": ((str,), False),
    "result": ((str,), False),
    "is_error": ((bool,), False),
    "known_tool": ((bool,), False),
    "parse_error": ((str,), False),
}
GRADE_FIELDS: _Fields = {"success": ((bool,), False)}

_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def _check(obj: Any, fields: _Fields, where: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'the record'}: must be an object (got {type(obj).__name__})")
    for key, (types, required) in fields.items():
        if key not in obj or (obj[key] is None and not required):
            if required:
                raise ValueError(f"{where + '.' if where else ''}{key}: missing")
            continue
        value = obj[key]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            names = " or ".join(_NAMES[t] for t in types)
            raise ValueError(f"{where + '.' if where else ''}{key}: must be {names} (got {str(value)[:40]!r})")


def check_trajectory_record(record: Any) -> None:
    """Raise ValueError naming the dotted field when `record` is not a trajectory the explainer can read: wrong
    types, more than `MAX_TURNS` turns, token counts outside 0 … `MAX_TOKENS` (in all)."""
    _check(record, TRAJECTORY_FIELDS, "")
    if record.get("grade") is not None:
        _check(record["grade"], GRADE_FIELDS, "grade")
    turns = record["turns"]
    if len(turns) > MAX_TURNS:
        raise ValueError(
            f"turns: {len(turns):,} turns, more than the {MAX_TURNS:,} an episode can have "
            "(spec.environment.max_turns is at most that); explain episodes the runner recorded"
        )
    tokens = 0
    for k, turn in enumerate(turns):
        _check(turn, TURN_FIELDS, f"turns[{k}]")
        count = turn.get("completion_tokens") or 0
        tokens += count
        if count < 0 or tokens > MAX_TOKENS:
            raise ValueError(
                f"turns[{k}].completion_tokens: {count:,} "
                + ("is negative" if count < 0 else f"brings the episode past {MAX_TOKENS:,} tokens")
            )
        version = turn.get("policy_version")
        if version is not None and not (
            len(version) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_STEPS for v in version)
            and version[0] <= version[1]
        ):
            raise ValueError(
                f"turns[{k}].policy_version: must be [first, last], two step numbers in 0 … {MAX_STEPS:,} with "
                f"first ≤ last (got {str(version)[:40]!r}); explain traces the rollout wrote"
            )
        for i, call in enumerate(turn.get("tool_calls") or []):
            _check(call, CALL_FIELDS, f"turns[{k}].tool_calls[{i}]")
