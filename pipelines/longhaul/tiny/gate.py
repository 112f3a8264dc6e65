"""Warm starts that train until their habits meet the build's criteria, not for a fixed step count.

Why: a warm start of hundreds of steps at a high learning rate is chaotic. Another CPU's rounding gives other
weights, and the habits the demo turns on — a well-formed first tool call, closing the conversation once the work
is done, the simulator's end markers — flip back and forth during training (measured: the share of well-formed
greedy first turns went 1.0, 0.9, 0.1, 0.4, 0.7 at steps 200-600 of one run, and P(close) climbed from 0 to 0.9
between steps 800 and 1300 with jumps of 0.35 between checks). A fixed step count therefore lands wherever that
machine's trajectory happens to be. The gate measures the habits every few steps (`longhaul.tiny.checks`) and
stops training at the first check that meets every criterion, so each machine's build stops where its own
trajectory meets them. Pure scheduling: the measuring is passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from longhaul.tiny.checks import Criterion

#: One measurement of a model's habits: the checks' findings (the report's form) and the criteria judged on them.
Measurement = tuple[dict[str, Any], list[Criterion]]


@dataclass
class Gate:
    """`stop_after` for `longhaul.tiny.warmstart.warm_start`: after every `every` steps from `first` on (0 = never),
    `measure()` runs on the current weights (in eval mode); training stops at the first measurement whose criteria
    are all met when `stop` is set (else it only records them). `last` is the newest (steps, findings);
    `history` every check's criterion values, for the report."""

    model: Any
    measure: Callable[[], Measurement]
    every: int
    first: int
    stop: bool
    log: Callable[[str], None]
    last: tuple[int, dict[str, Any]] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, step: int) -> bool:
        done = step + 1
        if not self.every or done < self.first or done % self.every:
            return False
        self.model.eval()
        try:
            found, judged = self.measure()
        finally:
            self.model.train()
        self.last = (done, found)
        self.history.append({"steps": done, **{c.name: round(c.value, 4) for c in judged}})
        met = bool(judged) and all(c.met for c in judged)
        values = ", ".join(f"{c.name} {c.value:.3f}" for c in judged)
        self.log(f"  check after {done} steps: {values}{' (all met)' if met else ''}")
        return self.stop and met

    def findings_at(self, steps: int) -> dict[str, Any] | None:
        """The findings of the check made after `steps` steps, if the newest check was made there."""
        return self.last[1] if self.last is not None and self.last[0] == steps else None
