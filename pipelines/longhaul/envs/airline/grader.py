"""τ² airline grading: database match with the gold replay × required information communicated.

The gold database for a task is obtained by replaying its gold actions on a fresh copy-on-access view of the
pristine base (cached per task and base); the episode's database is never modified by grading. Only records
touched by either side are compared (equal to comparing τ²'s hash of the full dump, because untouched records
are the same shared objects). Premature terminations (limits, loops, overflow, format errors) score 0.

Parity with the official evaluator (`tau2.evaluator.evaluator.evaluate_simulation` at the pinned commit, reward
basis DB × COMMUNICATE for every airline task) is pinned case by case by `tests/unit/envs/test_tau2_parity.py`
against rewards the official code computed (`tests/support/tau2_expectations.py` rebuilds them). One deliberate
difference: a gold action that fails raises `GoldReplayError` here (τ² logs it and goes on); none fails on the
pinned data, and a data change that broke one should stop the run, not quietly move every reward.
"""

from __future__ import annotations

import functools
from typing import Any

from longhaul.envs.airline.cowdb import EpisodeDB, diff_records
from longhaul.envs.airline.tasks import AirlineTask, get_task
from longhaul.envs.trajectory import NORMAL_TERMINATIONS, Grade, Termination


class GoldReplayError(RuntimeError):
    """A gold action failed on the pristine database: the pinned task data and the tools disagree."""


def build_gold_db(task: AirlineTask, base: Any) -> EpisodeDB:
    """Replay the task's gold actions on a fresh view of `base` (τ²: the reference environment)."""
    # deferred: the airline tools build pydantic models (~0.1 s); only the gold replay needs them
    from longhaul.envs.airline.tools import execute_tool, new_toolkit

    view = EpisodeDB(base)
    toolkit = new_toolkit(view)
    for a in task.actions:
        res = execute_tool(toolkit, a.name, dict(a.arguments))
        if res.is_error:
            raise GoldReplayError(f"task {task.id}: gold action {a.action_id or a.name} failed: {res.observation}")
    return view


@functools.lru_cache(maxsize=512)
def _gold_db_cached(task_id: str, base_id: int, base_ref: Any) -> EpisodeDB:
    return build_gold_db(get_task(task_id), base_ref)


def gold_db(task: AirlineTask, base: Any) -> EpisodeDB:
    """The cached gold view of a task (built once per process and base)."""
    return _gold_db_cached(task.id, id(base), _Ref(base))  # type: ignore[arg-type]


class _Ref:
    """Hashable by identity, so the cache key does not hash a whole database."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ref) and other.obj is self.obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self.obj, name)


def score_communicated(required: tuple[str, ...] | list[str], assistant_texts: list[str]) -> list[str]:
    """The required strings NOT found in any assistant text (τ²: case-insensitive, commas removed from the text)."""
    texts = [t.lower().replace(",", "") for t in assistant_texts if t]
    return [info for info in required if not any(info.lower() in t for t in texts)]


def grade_episode(
    task: AirlineTask,
    db: EpisodeDB,
    assistant_texts: list[str],
    termination: Termination | str,
    *,
    base: Any,
) -> Grade:
    """Grade one finished episode (pure with respect to `db`: nothing is written)."""
    term = Termination(termination)
    gold = gold_db(task, base)
    diff = diff_records(db, gold)
    missing = score_communicated(task.communicate_info, assistant_texts)
    db_match = not diff
    communicated = not missing
    premature = term not in NORMAL_TERMINATIONS
    success = db_match and communicated and not premature
    return Grade(
        success=success,
        reward=1.0 if success else 0.0,
        db_match=db_match,
        communicated=communicated,
        details={
            "termination": str(term),
            "premature": premature,
            "db_diff": diff[:20],
            "missing_info": missing,
            "gold_actions": len(task.actions),
        },
    )
