"""Real episodes without a network: task 5's gold calls played by a scripted policy against the τ² airline
environment, through the production episode runner (for tests that need a trajectory record)."""

from __future__ import annotations

import asyncio
import json

from longhaul.envs.airline.env import AirlineEnv
from longhaul.envs.airline.tasks import get_task
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.protocols import ParsedCall, PolicyTurn
from longhaul.envs.runner import run_episode


class _Policy:
    def __init__(self, turns: list[PolicyTurn]) -> None:
        self.turns, self.n = turns, 0

    async def next_turn(self, messages, tools, max_tokens):
        self.n += 1
        return self.turns[min(self.n - 1, len(self.turns) - 1)]


class _User:
    def __init__(self, replies: list[str]) -> None:
        self.replies, self.n = replies, 0

    async def reply(self, task, conversation):
        self.n += 1
        return self.replies[min(self.n - 1, len(self.replies) - 1)]


def gold_episode(trial: int, bad_call: bool = False) -> dict:
    """Task 5's gold calls (first, optionally, a call whose arguments are not JSON), a goodbye, the customer's
    ###STOP###: a successful episode's trajectory record (`Trajectory.to_dict()`)."""
    task = get_task("5")
    calls = [
        PolicyTurn("", [ParsedCall(a.name, dict(a.arguments), json.dumps(dict(a.arguments)), None)], 10)
        for a in task.actions
    ]
    if bad_call:
        calls.insert(0, PolicyTurn("", [ParsedCall("get_user_details", None, '{"user_id": ', "not JSON")], 7))
    policy = _Policy([*calls, PolicyTurn("All done. Anything else?", [], 6)])
    user = _User(["Hi, I need help with my booking.", "No, thanks. ###STOP###"])
    traj = asyncio.run(run_episode(AirlineEnv, task, policy, user, EpisodeLimits(max_turns=10), trial=trial, seed=3))
    return traj.to_dict()
