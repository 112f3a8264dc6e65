"""Teacher trajectory collection for the SFT stage: best-of-N episodes per TRAINING task through the shared
episode runner, keeping only graded successes, written as JSONL with provenance, plus per-task coverage (the
tasks with at least one success are `covered_seen`).

`build_collection_plan` is pure; `collect_trajectories` does the I/O (HTTP to the teacher and the simulator,
the output files).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from longhaul.envs.airline.env import AirlineEnv
from longhaul.envs.airline.splits import build_split
from longhaul.envs.airline.tasks import get_task, source_info
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.prompt import tool_schemas
from longhaul.envs.runner import run_episode
from longhaul.files import PLAIN, atomic_output
from longhaul.spec import run_name
from longhaul.spec.models import Experiment

#: JSONL record format version (bump on incompatible changes).
RECORD_VERSION = 1


@dataclass(frozen=True)
class Attempt:
    """One teacher episode: task, attempt index, temperature from the spec's schedule, seed."""

    task_id: str
    attempt: int
    temperature: float
    seed: int


def build_collection_plan(exp: Experiment) -> list[Attempt]:
    """Every (training task × attempt) of the spec, in a fixed order. Test tasks are never planned."""
    sft = exp.spec.sft
    if sft is None:
        raise ValueError("spec.sft is missing: the SFT stage needs a `sft:` section (teacher, epochs, ...)")
    split = build_split(exp.spec.environment.split)
    test = set(split.test)
    base_seed = exp.spec.algorithm.seed
    plan = []
    for tid in split.train:
        if tid in test:  # build_split already refuses overlaps; keep the guarantee local too
            raise ValueError(f"task {tid} is in both train and test of split {split.name}")
        for i, temp in enumerate(sft.teacher.temperatures):
            plan.append(
                Attempt(task_id=tid, attempt=i, temperature=temp, seed=base_seed * 1_000_003 + int(tid) * 1009 + i)
            )
    return plan


def build_provenance(exp: Experiment, teacher_url: str, simulator_url: str) -> dict[str, Any]:
    """Who produced the trajectories, with what settings (stored in every record)."""
    s = exp.spec
    assert s.sft is not None
    teacher, sim = s.sft.teacher, s.user_simulator
    return {
        "run_name": run_name(exp),
        "teacher": {
            "model": teacher.model.name,
            "revision": teacher.model.revision,
            "url": teacher_url,
            "max_tokens": teacher.max_tokens,
            "temperatures": list(teacher.temperatures),
        },
        "simulator": {
            "model": sim.model.name,
            "revision": sim.model.revision,
            "url": simulator_url,
            "sampling": sim.sampling.model_dump(mode="json"),
        },
        "environment": s.environment.model_dump(mode="json"),
        "data": source_info(),
    }


@dataclass
class CollectionReport:
    attempts: int = 0
    successes: int = 0
    coverage: dict[str, dict[str, int]] = field(default_factory=dict)  # task -> {attempts, successes}
    terminations: dict[str, int] = field(default_factory=dict)

    @property
    def covered(self) -> list[str]:
        return sorted((t for t, c in self.coverage.items() if c["successes"] > 0), key=int)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "covered_seen": self.covered}


async def collect_trajectories(
    exp: Experiment,
    *,
    teacher_url: str,
    simulator_url: str,
    out_path: Path,
    teacher_model: str | None = None,
    simulator_model: str | None = None,
    concurrency: int = 8,
    on_attempt: Callable[[Attempt, float], None] | None = None,
) -> CollectionReport:
    """Run the plan against the teacher and simulator endpoints; append successes to `out_path` (JSONL) and
    write `coverage.json` next to it. The output is written to a temporary file and moved at the end."""
    # deferred: httpx via the chat clients (~0.1 s)
    from longhaul.clients.openai_compat import ChatClient
    from longhaul.clients.policy import OpenAIPolicy, SamplingParams
    from longhaul.clients.user_simulator import OpenAIUserSimulator

    assert exp.spec.sft is not None
    teacher = exp.spec.sft.teacher
    sim = exp.spec.user_simulator
    plan = build_collection_plan(exp)
    limits = EpisodeLimits.from_spec(exp)
    provenance = build_provenance(exp, teacher_url, simulator_url)
    tools = tool_schemas()
    report = CollectionReport()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    sem = asyncio.Semaphore(concurrency)
    lock = asyncio.Lock()
    policy_client = ChatClient(teacher_url, teacher_model or teacher.model.name, role="teacher")
    user_client = ChatClient(simulator_url, simulator_model or sim.model.name, role="user_simulator")

    async def one(a: Attempt, fh: Any) -> None:
        async with sem:
            policy = OpenAIPolicy(
                policy_client,
                SamplingParams(temperature=a.temperature, top_p=1.0, max_tokens=teacher.max_tokens),
                seed=a.seed,
            )
            user = OpenAIUserSimulator(user_client, SamplingParams.from_spec(sim.sampling), seed=a.seed)
            traj = await run_episode(
                AirlineEnv, get_task(a.task_id), policy, user, limits, trial=a.attempt, seed=a.seed
            )
        async with lock:
            cov = report.coverage.setdefault(a.task_id, {"attempts": 0, "successes": 0})
            cov["attempts"] += 1
            report.attempts += 1
            report.terminations[traj.termination] = report.terminations.get(traj.termination, 0) + 1
            if traj.outcome == 1.0:
                cov["successes"] += 1
                report.successes += 1
                record = {
                    "version": RECORD_VERSION,
                    "task_id": a.task_id,
                    "attempt": a.attempt,
                    "temperature": a.temperature,
                    "seed": a.seed,
                    "reward": traj.outcome,
                    "termination": traj.termination,
                    "messages": traj.messages,
                    "tools": tools,
                    "provenance": provenance,
                }
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                fh.flush()
            if on_attempt is not None:
                on_attempt(a, traj.outcome)

    try:
        with atomic_output(out_path, mode=PLAIN) as tmp, tmp.open("w", encoding="utf-8") as fh:
            await asyncio.gather(*(one(a, fh) for a in plan))
    finally:
        await policy_client.aclose()
        await user_client.aclose()
    (out_path.parent / "coverage.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    return report
