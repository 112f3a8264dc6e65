"""The one evaluation driver: a policy endpoint against the user simulator over an `EvalPlan`, every trial graded
once, then summarised. `longhaul eval` (`longhaul.commands.eval`) and the launcher's eval stage
(`longhaul.launcher.evaluate`) both evaluate through it, so an evaluation is the same wherever it runs.

The recipe, one named step each:

1. `open_client` ×2 — the policy's and the user simulator's OpenAI-compatible clients (`EvalJob.policy`,
   `EvalJob.user`: URL, served model name, API key; the job's retry budget and connection limit);
2. `build_eval_agents` — the policy samples with `policy.rollout.validation`, the simulator with its own sampling;
3. `longhaul.eval.evaluate.evaluate` — every trial of the plan with the shared episode runner, each record appended
   to `EvalJob.results_path` as it finishes (`on_done` sees every trajectory: progress, a stop request);
4. the clients are closed (also when a trial raised);
5. `summarize` — `summarize_evaluation` with the spec's bootstrap and confidence, seeded with the first
   evaluation seed (`bootstrap_seed`).

What differs stays with the callers: the CLI resolves its options, prints a header, a progress bar and the table;
the stage merges and serves each checkpoint, publishes its records atomically and logs them to MLflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longhaul.clients import openai_compat
from longhaul.envs.airline.splits import Split
from longhaul.envs.limits import EpisodeLimits
from longhaul.eval import evaluate as evaluation
from longhaul.eval.metrics import bootstrap_seed

#: The roles the clients report in their errors (an endpoint that fails past its retries names its role).
POLICY_ROLE, USER_ROLE = "policy", "user simulator"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server: its base URL, the served model name, the API key (None: no Authorization)."""

    base_url: str
    model: str
    api_key: str | None = None


@dataclass(frozen=True)
class EvalJob:
    """One evaluation: the spec whose sampling the agents use, the trials, the episode limits, the two endpoints,
    where the records go (`results_path`, and `trajectories_path` for whole trajectories) and the run facts every
    record carries (`run_info`). `retry` and `max_connections` are the clients' (None: `ChatClient`'s defaults);
    `env_factory` makes each episode's environment (None: `evaluate`'s)."""

    spec: Any
    plan: evaluation.EvalPlan
    split: Split
    limits: EpisodeLimits
    policy: Endpoint
    user: Endpoint
    concurrency: int
    results_path: Path
    run_info: dict[str, Any]
    trajectories_path: Path | None = None
    retry: openai_compat.RetryPolicy | None = None
    max_connections: int | None = None
    env_factory: Callable[[], Any] | None = None


def open_client(job: EvalJob, endpoint: Endpoint, role: str) -> openai_compat.ChatClient:
    """The chat client of one endpoint of `job` (closed by `async with`)."""
    limits = {} if job.max_connections is None else {"max_connections": job.max_connections}
    return openai_compat.ChatClient(
        endpoint.base_url, endpoint.model, api_key=endpoint.api_key, retry=job.retry, role=role, **limits
    )


async def run_trials(job: EvalJob, on_done: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Steps 1–4 of the recipe inside a running event loop: the records of every trial, in plan order."""
    factory = {} if job.env_factory is None else {"env_factory": job.env_factory}
    async with open_client(job, job.policy, POLICY_ROLE) as pc, open_client(job, job.user, USER_ROLE) as uc:
        policy, user = evaluation.build_eval_agents(job.spec, pc, uc)
        return await evaluation.evaluate(
            job.plan,
            policy=policy,
            user=user,
            limits=job.limits,
            split=job.split,
            concurrency=job.concurrency,
            results_path=job.results_path,
            trajectories_path=job.trajectories_path,
            run_info=job.run_info,
            on_done=on_done,
            **factory,
        )


def run_evaluation(job: EvalJob, on_done: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Run `job` to its records (`run_trials` in an event loop of its own). An endpoint that fails past its retries
    for too many trials raises `PolicyEndpointError`; whatever `on_done` raises stops the evaluation too."""
    return asyncio.run(run_trials(job, on_done))


def summarize(records: Sequence[dict[str, Any]], ks: Sequence[int], settings: Any, seeds: Sequence[int]) -> dict:
    """Step 5: the summary of the records — pass^k for `ks`, pass@k, subsets, bootstrap CIs with the spec's
    `evaluation` `settings` (resamples, confidence), seeded with the first of the evaluation `seeds`."""
    return evaluation.summarize_evaluation(
        records,
        ks,
        bootstrap=settings.bootstrap_samples,
        confidence=settings.confidence,
        seed=bootstrap_seed(seeds),
    )
