"""The values a memory plan is made of (pure): rows per column, phases with their capacity, issues, the plan.

`longhaul.memory.plan` computes them; `longhaul.memory.plan_text` prints them; `MemoryPlan.to_dict` is what
`longhaul plan --json` and the Experiment status carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longhaul.memory.estimate import TIGHT_FRACTION
from longhaul.memory.gpus import GiB


def gib(n: float) -> str:
    """Bytes as GiB with two decimals, the unit of every figure the plan prints."""
    return f"{n / GiB:.2f}"


def verdict(total: int, capacity: int) -> str:
    """'OVER' above capacity, 'tight' within `TIGHT_FRACTION` of it (the estimates' error), else 'fits'."""
    if total > capacity:
        return "OVER"
    return "tight" if capacity - total < TIGHT_FRACTION * capacity else "fits"


@dataclass(frozen=True)
class Row:
    """One component: bytes per column (GPU or host). `counted=False` rows explain and are not summed."""

    label: str
    values: tuple[int, ...]
    counted: bool = True


@dataclass(frozen=True)
class Issue:
    """A finding with the field to change. `blocking`: a phase over capacity or an engine that cannot start."""

    field: str
    message: str
    hint: str
    blocking: bool = True

    def render(self) -> str:
        return f"{self.field}: {self.message}; {self.hint}"


@dataclass(frozen=True)
class Phase:
    """One phase: per column (GPU or host) the rows held against the capacity; one the stages do not run has
    `applies=False` and says why in `reason`."""

    name: str
    title: str
    columns: tuple[str, ...]  # "GPU 0", …, or "host"
    capacity: int  # per column
    rows: tuple[Row, ...] = ()
    applies: bool = True
    reason: str = ""  # why it does not apply
    host: int | None = None  # node host RAM in this phase (GPU specs)
    notes: tuple[str, ...] = ()

    def totals(self) -> tuple[int, ...]:
        return tuple(sum(r.values[i] for r in self.rows if r.counted) for i in range(len(self.columns)))

    def verdicts(self) -> tuple[str, ...]:
        return tuple(verdict(total, self.capacity) for total in self.totals())

    @property
    def fits(self) -> bool:
        return not self.applies or all(t <= self.capacity for t in self.totals())


@dataclass(frozen=True)
class MemoryPlan:
    """The plan: header lines, one line per vLLM engine, the phases and the issues found."""

    title: str
    header: tuple[tuple[str, str], ...]
    engines: tuple[tuple[str, str], ...]
    phases: tuple[Phase, ...]
    host_capacity: int
    issues: tuple[Issue, ...] = field(default=())

    @property
    def blocking(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if i.blocking)

    @property
    def warnings(self) -> tuple[Issue, ...]:
        return tuple(i for i in self.issues if not i.blocking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "header": dict(self.header),
            "engines": dict(self.engines),
            "host_capacity_bytes": self.host_capacity,
            "phases": [
                {
                    "name": p.name,
                    "title": p.title,
                    "applies": p.applies,
                    "reason": p.reason,
                    "columns": list(p.columns),
                    "capacity_bytes": p.capacity,
                    "host_bytes": p.host,
                    "notes": list(p.notes),
                    "rows": [{"label": r.label, "bytes": list(r.values), "counted": r.counted} for r in p.rows],
                    "total_bytes": list(p.totals()) if p.applies else [],
                    "verdict": list(p.verdicts()) if p.applies else [],
                }
                for p in self.phases
            ],
            "issues": [
                {"field": i.field, "message": i.message, "hint": i.hint, "blocking": i.blocking} for i in self.issues
            ],
        }
