"""Run an evaluation: n trials per task through the shared episode runner against OpenAI-compatible endpoints.

Trials run concurrently (bounded), each with its own seed; every finished trial is appended to the results
JSONL at once (so an interrupted run keeps what it did). An endpoint failure that survives the client's retries
ends that episode with termination `endpoint_error`: the record says so (`scored: false`, the error under
`endpoint_error`) and the metrics leave the task out (`longhaul.eval.metrics`); it is never a failed trial. A
flaky endpoint costs a few episodes; a dead one stops the evaluation: once more than `UNSCORED_SHARE` of the
trials (any, for fewer than 10 trials) end that way, `evaluate` raises `PolicyEndpointError`.
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from longhaul import bounded
from longhaul import constants as C
from longhaul.envs.airline.env import AirlineEnv, null_agent_outcomes
from longhaul.envs.airline.splits import Split
from longhaul.envs.airline.tasks import get_task, load_tasks, source_info
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.protocols import PolicyEndpointError
from longhaul.envs.runner import run_episode
from longhaul.envs.trajectory import Trajectory
from longhaul.eval.metrics import TrialRecord, summarize_records

#: The share of an evaluation's trials that may end on an endpoint error before it stops (module docstring).
UNSCORED_SHARE = 0.1


def episode_seed(base_seed: int, task_id: str, trial: int) -> int:
    """A distinct, reproducible sampling seed per (base seed, task, trial)."""
    t = int(task_id) if str(task_id).isdigit() else zlib.crc32(str(task_id).encode()) % 100_000
    return base_seed * 100_000_000 + t * 1_000 + trial


def build_record(traj: Trajectory, split: Split | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The per-trial JSONL record (`longhaul eval summarize` input)."""
    g = traj.grade
    rec = {
        "task_id": traj.task_id,
        "trial": traj.trial,
        "seed": traj.seed,
        "success": bool(g and g.success),
        "reward": traj.outcome if traj.scored else None,
        "scored": traj.scored,
        "subset": split.primary(traj.task_id) if split else None,
        "subsets": split.labels(traj.task_id) if split else [],
        "termination": traj.termination,
        "aborted": traj.aborted,
        "db_match": bool(g and g.db_match),
        "communicated": bool(g and g.communicated),
        "num_turns": len(traj.turns),
        "num_tool_calls": traj.num_tool_calls,
        "num_tool_errors": traj.num_tool_errors,
        "num_unknown_tool_calls": traj.num_unknown_tool_calls,
        "completion_tokens": traj.completion_tokens,
        "response_tokens": traj.metadata.get("response_tokens"),
    }
    if not traj.scored:
        rec["endpoint_error"] = traj.metadata.get("endpoint_error")
        rec["endpoint_fault"] = traj.metadata.get("endpoint_fault")
    rec.update(extra or {})
    return rec


def unscored_budget(trials: int) -> int:
    """How many trials of an evaluation may end on an endpoint error before it stops."""
    return int(trials * UNSCORED_SHARE)


def build_run_info(policy_model: str, user_model: str, limits: EpisodeLimits, split: Split | None) -> dict[str, Any]:
    """What every record carries about the harness (method.md h.14: seeds and harness commit in every record)."""
    src = source_info()
    return {
        "policy_model": policy_model,
        "user_model": user_model,
        "split": split.name if split else None,
        "harness": f"longhaul {version('longhaul')}",
        "harness_commit": os.environ.get(C.ENV_GIT_COMMIT),
        "data": f"{src.get('package')} ({src.get('source_version')})",
        "max_turns": limits.max_turns,
        "tool_output_limit": limits.tool_output_limit,
    }


@dataclass
class EvalPlan:
    task_ids: list[str]
    samples: int
    seeds: list[int]

    def trials(self) -> list[tuple[str, int, int]]:
        """(task id, trial index, sampling seed); trials of several base seeds are pooled (n = samples × seeds)."""
        out = []
        for tid in self.task_ids:
            for si, base in enumerate(self.seeds):
                for j in range(self.samples):
                    trial = si * self.samples + j
                    out.append((tid, trial, episode_seed(base, tid, j)))
        return out


async def evaluate(
    plan: EvalPlan,
    *,
    policy: Any,
    user: Any,
    limits: EpisodeLimits,
    split: Split | None,
    concurrency: int,
    results_path: Path | None = None,
    trajectories_path: Path | None = None,
    run_info: dict[str, Any] | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
    env_factory: Callable[[], AirlineEnv] = AirlineEnv,
) -> list[dict[str, Any]]:
    """Run every trial of `plan`; return the records (in plan order). `policy` and `user` need `with_seed`."""
    sem = asyncio.Semaphore(concurrency)
    trials = plan.trials()
    records: list[dict[str, Any] | None] = [None] * len(trials)
    budget, unscored = unscored_budget(len(trials)), []
    res_f = results_path.open("a", encoding="utf-8") if results_path else None
    traj_f = trajectories_path.open("a", encoding="utf-8") if trajectories_path else None

    async def one(i: int, tid: str, trial: int, seed: int) -> None:
        async with sem:
            traj = await run_episode(
                env_factory, get_task(tid), policy.with_seed(seed), user.with_seed(seed), limits, trial=trial, seed=seed
            )
        rec = build_record(traj, split, run_info)
        records[i] = rec
        if res_f:
            res_f.write(json.dumps(rec) + "\n")
            res_f.flush()
        if traj_f:
            traj_f.write(json.dumps(traj.to_dict()) + "\n")
            traj_f.flush()
        if on_done:
            on_done(traj)
        if not traj.scored:
            unscored.append(rec["endpoint_error"])
            if len(unscored) > budget:
                raise PolicyEndpointError(
                    f"{len(unscored)} of {len(trials)} episodes ended on an endpoint that failed past its retries "
                    f"(at most {budget} may: {UNSCORED_SHARE:.0%}); last: {rec['endpoint_error']}"
                )

    try:
        async with asyncio.TaskGroup() as tg:
            for i, (tid, trial, seed) in enumerate(trials):
                tg.create_task(one(i, tid, trial, seed))
    except* Exception as eg:  # the first real failure (an endpoint down for too many episodes) stops the evaluation
        raise eg.exceptions[0] from None
    finally:
        for f in (res_f, traj_f):
            if f:
                f.close()
    return [r for r in records if r is not None]


def load_records(path: Path) -> list[dict[str, Any]]:
    """Read a results JSONL file, bounded by `longhaul.bounded.RESULTS`, every record type-checked as a trial
    record; errors (`InputError`, a ValueError) name the file, the line and the field."""
    expected = "one trial record (a JSON object) per line"
    out = []
    for line, rec in bounded.read_jsonl(path, bounded.RESULTS, expected=expected):
        try:
            TrialRecord.from_dict(rec)
        except (ValueError, KeyError) as exc:
            raise bounded.InputError(str(path), line, "", str(exc.args[0]), hint=expected) from None
        out.append(rec)
    return out


def build_eval_agents(spec: Any, policy_client: Any, user_client: Any) -> tuple[Any, Any]:
    """The policy and the user simulator of an evaluation over two chat clients: the policy samples with
    `policy.rollout.validation` (as veRL's validation does), the simulator with its own `user_simulator.sampling`.
    `longhaul eval` and the launcher's eval stage both build them here."""
    # deferred: httpx via the chat clients (~0.1 s)
    from longhaul.clients.policy import OpenAIPolicy, SamplingParams
    from longhaul.clients.user_simulator import OpenAIUserSimulator

    return (
        OpenAIPolicy(policy_client, SamplingParams.from_spec(spec.policy.rollout.validation)),
        OpenAIUserSimulator(user_client, SamplingParams.from_spec(spec.user_simulator.sampling)),
    )


def summarize_evaluation(
    records: Sequence[dict[str, Any]],
    ks: Sequence[int] | None,
    *,
    bootstrap: int,
    confidence: float,
    seed: int,
    null_floor: bool = True,
) -> dict[str, Any]:
    """The summary of an evaluation's records: the one function behind `longhaul eval`, `longhaul eval summarize`
    and the launcher's eval stage, so the same records give the same document wherever they were produced.

    `longhaul.eval.metrics.summarize_records` (`seed`: `bootstrap_seed(evaluation seeds)`), plus the do-nothing
    agent's floor when `null_floor` and every task id is an airline task."""
    floor = None
    if null_floor:
        known = load_tasks()
        ids = sorted({TrialRecord.from_dict(r).task_id for r in records})
        if all(t in known for t in ids):
            floor = null_agent_outcomes(ids)
    return summarize_records(records, ks, bootstrap=bootstrap, confidence=confidence, seed=seed, null_floor=floor)


def select_tasks(split: Split, which: str | None, explicit: Sequence[str] | None) -> list[str]:
    """Task ids to evaluate: an explicit list, a subset name of the split, or all tasks of the split."""
    if explicit:
        return [str(t) for t in explicit]
    if which in (None, "all"):
        return split.all_ids
    if which not in split.subsets:
        raise ValueError(f"unknown subset {which!r} for split {split.name}; valid: all, {', '.join(split.subsets)}")
    return list(split.subsets[which])
