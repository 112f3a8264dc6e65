"""Lookups into a `longhaul.memory` plan for tests: one phase by name, one row by its label's start."""

from __future__ import annotations

from longhaul.memory.plan_values import MemoryPlan, Phase, Row


def plan_phase(plan: MemoryPlan, name: str) -> Phase:
    """The plan's only phase called `name` (fails if there is none, or several)."""
    (phase,) = [p for p in plan.phases if p.name == name]
    return phase


def plan_row(phase: Phase, prefix: str) -> Row:
    """The phase's only row whose label starts with `prefix` (fails if there is none, or several)."""
    (row,) = [r for r in phase.rows if r.label.startswith(prefix)]
    return row
