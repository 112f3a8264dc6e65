"""A user simulator that injects faults per τ² task, served by the scripted OpenAI stub (`support.openai_stub`).

It recognises the task of each request from the scenario block that `longhaul.clients.user_simulator` puts in
the system prompt (`<scenario>\\n<task.user_instructions()>\\n</scenario>`), gives each task one `Fault` and
keeps it for the whole run, and records every request it answered (`requests`: task, seed, fault, HTTP status).

Faults are handed out to tasks in the order the tasks are first seen: the first task seen gets `faults[0]`, the
second `faults[1]`, …, every later one `Fault.NORMAL`. A test cannot pick them by task id because veRL shuffles
the training set; handed out by arrival, failing faults listed first hit the first prompts a trainer dispatches.

    sim = FaultyUserSimulator({"0": scenario_0, ...}, [Fault.SERVER_ERROR, Fault.OVERLONG], model="user")
    with sim:
        ...  # point spec.user_simulator.url at sim.base_url
    sim.assigned, sim.requests
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from support.openai_stub import Reply, StubServer


class Fault(StrEnum):
    """What the simulated customer does for a task."""

    NORMAL = "normal"  # short replies, ###STOP### from its third message on
    STOP_AT_ONCE = "stop_at_once"  # opens with ###STOP###: an episode with no generation
    SERVER_ERROR = "server_error"  # every request answered HTTP 500/503 (past the client's retries)
    OVERLONG = "overlong"  # an opening message so long that the first prompt is over the prompt budget


#: Statuses a SERVER_ERROR task is answered with, in turn.
ERROR_STATUSES = (500, 503)


@dataclass(frozen=True)
class SimRequest:
    """One chat request the simulator answered."""

    task_id: str | None  # None: no known scenario in the system prompt
    seed: int | None
    fault: Fault | None
    status: int
    prior_user_lines: int  # messages the customer had already written (0: the opening message)


def scenario_marker(instructions: str) -> str:
    """The text of the system prompt that names one task (see `longhaul.clients.user_simulator.USER_GUIDELINES`)."""
    return f"<scenario>\n{instructions.strip()}\n</scenario>"


def overlong_message(words: int) -> str:
    """An opening message of `words` distinct words (several tokens each: no tokenizer merges them away)."""
    return "My booking details: " + " ".join(f"detail{i}" for i in range(words))


class FaultyUserSimulator:
    """The fault-injecting simulator (module docstring). `scenarios` maps task id → `task.user_instructions()`."""

    def __init__(
        self, scenarios: Mapping[str, str], faults: Sequence[Fault], *, model: str, overlong_words: int = 1500
    ) -> None:
        self._markers = {task_id: scenario_marker(text) for task_id, text in scenarios.items()}
        if len(set(self._markers.values())) != len(self._markers):
            raise ValueError("two tasks have the same user instructions: the simulator could not tell them apart")
        self._pending = list(faults)
        self._lock = threading.Lock()
        self.model = model
        self.overlong_words = overlong_words
        self.assigned: dict[str, Fault] = {}
        self.requests: list[SimRequest] = []
        self.server = StubServer({model: self._script})

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def __enter__(self) -> FaultyUserSimulator:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def task_of(self, body: Mapping[str, Any]) -> str | None:
        messages = body.get("messages") or []
        system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
        found = [task_id for task_id, marker in self._markers.items() if marker in system]
        return found[0] if len(found) == 1 else None

    def tasks_with(self, fault: Fault) -> list[str]:
        return [task_id for task_id, f in self.assigned.items() if f == fault]

    def _script(self, body: dict[str, Any]) -> Reply:
        task_id = self.task_of(body)
        # the simulator writes the `assistant` side of its own chat (roles flipped)
        prior = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        with self._lock:
            fault = None
            if task_id is not None:
                if task_id not in self.assigned:
                    self.assigned[task_id] = self._pending.pop(0) if self._pending else Fault.NORMAL
                fault = self.assigned[task_id]
            errors = sum(1 for r in self.requests if r.fault == Fault.SERVER_ERROR)
            reply = self._reply(fault, prior, errors)
            self.requests.append(SimRequest(task_id, body.get("seed"), fault, reply.status, prior))
        return reply

    def _reply(self, fault: Fault | None, prior: int, errors: int) -> Reply:
        if fault is None:
            return Reply(
                status=400, error="fault-injecting user simulator: no known task scenario in the system prompt"
            )
        if fault == Fault.SERVER_ERROR:
            return Reply(status=ERROR_STATUSES[errors % len(ERROR_STATUSES)], error="injected server error")
        if fault == Fault.STOP_AT_ONCE:
            return Reply("###STOP###")
        if fault == Fault.OVERLONG and prior == 0:
            return Reply(overlong_message(self.overlong_words))
        if prior >= 2:
            return Reply("Thank you, that is all. ###STOP###")
        return Reply("Hi, I would like some help with my reservation." if prior == 0 else "Yes, please go ahead.")
