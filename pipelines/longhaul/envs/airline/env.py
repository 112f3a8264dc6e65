"""The airline environment: `reset(task)`, `step(action)`, one terminal event, one grade.

Each episode gets a copy-on-access view of the shared database (`cowdb.EpisodeDB`), so reset is three empty
dicts and an idle episode costs a few kilobytes. The episode ends on the FIRST terminal event (the user's or
agent's stop, a limit); later terminal events are ignored and the grade, computed exactly once without touching
the live database, never changes (method.md c.3, h.6).

Transfers follow τ² by default: `transfer_to_human_agents` is an ordinary tool, and the conversation goes on
until the user simulator (which says `###TRANSFER###`) or the agent stops it, so writes and messages after a
transfer count. `reset(task, transfer_ends_episode=True)` gives τ-bench 1's rule instead: a successful transfer
is the terminal event (`spec.environment.transfer_ends_episode`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longhaul.envs.airline import tasks as _tasks
from longhaul.envs.airline.cowdb import EpisodeDB
from longhaul.envs.airline.grader import grade_episode
from longhaul.envs.airline.tasks import AirlineTask
from longhaul.envs.airline.tools import TERMINAL_TOOLS, execute_tool, new_toolkit
from longhaul.envs.trajectory import Grade, Termination


@dataclass(frozen=True)
class ToolAction:
    """Call a tool. `arguments` is None (and `parse_error` set) when the policy's JSON could not be parsed."""

    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str = ""
    call_id: str = ""
    parse_error: str | None = None
    content: str = ""  # assistant text of the same turn (counts as communicated, τ² semantics)


@dataclass(frozen=True)
class MessageAction:
    """Send a message to the user. `###STOP###` in it is the agent's stop."""

    content: str


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_error(self) -> bool:
        return bool(self.info.get("is_error", False))

    @property
    def known_tool(self) -> bool:
        return bool(self.info.get("known_tool", True))

    @property
    def termination(self) -> str | None:
        return self.info.get("termination")


class EpisodeOverError(RuntimeError):
    """A step after the episode's terminal event (a harness bug: the runner stops at the first one)."""


class AirlineEnv:
    """One τ² airline episode at a time; cheap to create, cheap to reset."""

    def __init__(self, base: Any | None = None) -> None:
        self._base = base if base is not None else _tasks.base_db()
        self.task: AirlineTask | None = None
        self.db: EpisodeDB | None = None
        self._termination: Termination | None = None
        self._grade: Grade | None = None
        self.grade_computations = 0
        self.assistant_texts: list[str] = []
        self.tool_log: list[tuple[str, dict[str, Any] | None, bool]] = []
        self.transfer_ends_episode = False

    @property
    def policy_text(self) -> str:
        return _tasks.policy_text()

    @property
    def termination(self) -> Termination | None:
        return self._termination

    @property
    def done(self) -> bool:
        return self._termination is not None

    def reset(self, task: AirlineTask | str | int, *, transfer_ends_episode: bool = False) -> str:
        """Start an episode on a private view of the pristine database; returns the policy text.

        `transfer_ends_episode`: τ-bench 1's rule, a successful `transfer_to_human_agents` ends the episode
        (default: τ²'s, the transfer is an ordinary tool call)."""
        self.task = task if isinstance(task, AirlineTask) else _tasks.get_task(task)
        self.transfer_ends_episode = transfer_ends_episode
        self.db = EpisodeDB(self._base)
        self._toolkit = new_toolkit(self.db)  # duck-typed FlightDB view
        self._termination = None
        self._grade = None
        self.grade_computations = 0
        self.assistant_texts = []
        self.tool_log = []
        return self.policy_text

    def note_assistant_text(self, content: str) -> None:
        """Record assistant text that accompanied tool calls (it counts as communicated, as in τ²)."""
        if content and content.strip():
            self.assistant_texts.append(content)

    def step(self, action: ToolAction | MessageAction) -> StepResult:
        """Apply one action. Tool failures are error observations; a successful `transfer_to_human_agents` ends
        the episode only under `transfer_ends_episode` (τ-bench 1)."""
        if self.task is None or self.db is None:
            raise EpisodeOverError("step() before reset(task)")
        if self._termination is not None:
            raise EpisodeOverError(f"step() after the episode ended ({self._termination})")
        if isinstance(action, MessageAction):
            self.note_assistant_text(action.content)
            if "###STOP###" in action.content:
                self.terminate(Termination.AGENT_STOP)
                return StepResult("", True, {"termination": str(Termination.AGENT_STOP)})
            return StepResult("", False, {})
        self.note_assistant_text(action.content)
        res = execute_tool(self._toolkit, action.name, action.arguments, action.parse_error)
        self.tool_log.append((action.name, action.arguments, res.is_error))
        info: dict[str, Any] = {"is_error": res.is_error, "known_tool": res.known_tool}
        if self.transfer_ends_episode and action.name in TERMINAL_TOOLS and not res.is_error:
            self.terminate(Termination.TRANSFER)
            info["termination"] = str(Termination.TRANSFER)
            return StepResult(res.observation, True, info)
        return StepResult(res.observation, False, info)

    def terminate(self, reason: Termination | str | None) -> Termination:
        """Record a terminal event. Only the first one counts; the effective reason is returned."""
        if self._termination is None:
            if reason is None:
                raise ValueError("terminate(None): give the reason the episode ended")
            self._termination = Termination(reason)
        return self._termination

    def grade(self) -> Grade:
        """The episode's grade, computed once after the terminal event and cached (later calls return it)."""
        if self._termination is None or self.task is None or self.db is None:
            raise RuntimeError("grade() before the episode ended: call terminate(reason) first")
        if self._grade is None:
            self.grade_computations += 1
            self._grade = grade_episode(self.task, self.db, self.assistant_texts, self._termination, base=self._base)
        return self._grade


def replay_gold(task: AirlineTask | str | int, *, communicate: bool = True, base: Any | None = None) -> Grade:
    """Run a task's gold actions through the environment (and say the required strings) and grade it."""
    env = AirlineEnv(base)
    env.reset(task)
    assert env.task is not None
    for i, a in enumerate(env.task.actions):
        res = env.step(ToolAction(a.name, dict(a.arguments), call_id=f"gold_{i}"))
        if res.done:
            break
    if communicate and env.task.communicate_info and not env.done:
        env.step(MessageAction("Here is what you asked for: " + "; ".join(env.task.communicate_info)))
    env.terminate(Termination.USER_STOP)
    return env.grade()


def null_agent_grade(task: AirlineTask | str | int, *, base: Any | None = None) -> Grade:
    """The grade of an agent that does nothing and the user ends the conversation (method.md c.2b)."""
    env = AirlineEnv(base)
    env.reset(task)
    env.terminate(Termination.USER_STOP)
    return env.grade()


def null_agent_outcomes(task_ids: list[str] | None = None) -> dict[str, float]:
    """Task id → 1.0/0.0 for the do-nothing agent: the floor every pass^k should be read against."""
    ids = task_ids if task_ids is not None else list(_tasks.load_tasks())
    return {str(t): 1.0 if null_agent_grade(t).success else 0.0 for t in ids}
