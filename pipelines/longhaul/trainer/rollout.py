"""Run many episodes concurrently through the shared episode runner against the policy and simulator servers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from longhaul.envs.trajectory import Trajectory


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to run: task, trial number (within its group) and seed."""

    task_id: str
    trial: int
    seed: int


class RolloutStopped(Exception):  # noqa: N818 - control flow
    """A stop or checkpoint request arrived while episodes were running; the partial results are discarded."""


def run_episodes(
    jobs: Sequence[EpisodeJob],
    *,
    policy_url: str,
    policy_model: str,
    policy_sampling: Any,
    simulator_url: str,
    simulator_model: str,
    simulator_sampling: Any,
    limits: Any,
    concurrency: int,
    should_stop: Callable[[], bool] = lambda: False,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Episodes for `jobs` (same order). Endpoint failures propagate: a broken server aborts the run."""
    return asyncio.run(_run(jobs, policy_url, policy_model, policy_sampling, simulator_url, simulator_model,
                            simulator_sampling, limits, concurrency, should_stop, on_done))


async def _run(jobs, policy_url, policy_model, policy_sampling, simulator_url, simulator_model, simulator_sampling,
               limits, concurrency, should_stop, on_done) -> list[Trajectory]:
    from longhaul.clients.openai_compat import ChatClient
    from longhaul.clients.policy import OpenAIPolicy, SamplingParams
    from longhaul.clients.user_simulator import OpenAIUserSimulator
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.tasks import base_db, get_task
    from longhaul.envs.runner import run_episode

    base = base_db()
    sem = asyncio.Semaphore(max(1, concurrency))
    async with ChatClient(policy_url, policy_model, role="policy") as pc, \
            ChatClient(simulator_url, simulator_model, role="user simulator") as uc:
        policy = OpenAIPolicy(pc, SamplingParams.from_spec(policy_sampling))
        user = OpenAIUserSimulator(uc, SamplingParams.from_spec(simulator_sampling))

        async def one(job: EpisodeJob) -> Trajectory:
            async with sem:
                if should_stop():
                    raise RolloutStopped(job.task_id)
                traj = await run_episode(
                    lambda: AirlineEnv(base), get_task(job.task_id), policy.with_seed(job.seed),
                    user.with_seed(job.seed), limits, trial=job.trial, seed=job.seed,
                )
                if on_done is not None:
                    on_done(traj)
                return traj

        tasks = [asyncio.create_task(one(j)) for j in jobs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
