"""The longhaul agent loop inside veRL's agent-loop worker, measured side by side in one run on this machine.

    python benchmarks/bench_agent_loop.py [--trajectories 16] [--turns 8] [--rounds 3] [--quick]

1. CPU cost per turn: `LonghaulAirlineAgentLoop` vs veRL's stock `ToolAgentLoop`, both built by Hydra from their
   registry entries as veRL's worker does, on the same stub `server_manager` (fixed token outputs: `--turns`
   Hermes tool calls, then a final message), the same prompt (policy text + the 14 airline tool schemas + the
   first user message) and the same tool observations. longhaul runs its whole episode (environment, airline
   tools on the episode's database, a scripted user simulator in-process, grading, PRM-Lite, traces off); the
   stock loop runs stub tools returning the same observations. Process CPU time (all threads) divided by the
   number of generate calls, concurrent trajectories, median over rounds. Target: ≤ 1.2×.
2. Event-loop stalls: the agent loop with its real user simulator (`make_user_simulator`: HTTP to the scripted
   OpenAI-compatible server in a separate process) while a heartbeat coroutine on the same loop records the
   largest gap between its 1 ms ticks; the worst stall any trajectory saw. Side by side: the shared client per
   event loop (now) and a client built per trajectory with its own TLS contexts (before); for scale, the stock
   loop's stalls on the same loop and stub server, and an idle heartbeat's. Target: ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SPEC_YAML = """
apiVersion: longhaul.dev/v1alpha1
kind: Experiment
metadata: {name: bench-agent-loop}
spec:
  environment: {max_prompt_tokens: 200000, max_response_tokens: 100000, max_turns: 60}
  reward: {process: prm_lite, weight: 0.3, credit: turn}
"""
OPENING = "Hi, I need to change my reservation."
TASK = "11"


def _harness():
    """The agent-loop test harness (byte-level tokenizer with Hermes tokens and chat template, scripted user)."""
    path = ROOT / "tests" / "unit" / "agentloop" / "test_agent_loop.py"
    spec = importlib.util.spec_from_file_location("agentloop_harness", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compose(tmp: Path):
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from longhaul.agentloop.config import AGENT_LOOP_NAME, render_agent_loop_yaml
    from longhaul.layout import AGENT_LOOP_FILE, Paths
    from longhaul.render.verl import render_verl_overrides
    from longhaul.spec.load import parse_spec_text

    exp = parse_spec_text(SPEC_YAML)
    paths = Paths.under(str(tmp))
    path = Path(paths.config_dir) / AGENT_LOOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_agent_loop_yaml(exp))
    with initialize_config_dir(
        config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None
    ):
        # The production override list, exactly as the renderer emits it.
        cfg = hydra_compose("ppo_trainer", overrides=render_verl_overrides(exp, paths))
    entry = next(e for e in OmegaConf.load(path) if e.name == AGENT_LOOP_NAME)
    stock = OmegaConf.create({"_target_": "verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop"})
    return cfg, entry, stock


def script_and_observations(turns: int):
    """The policy's completions (tool calls on the task's reservation, then a final message) and the airline
    environment's observation for each call (what the stock loop's stub tools return)."""
    from longhaul.envs.airline.env import AirlineEnv, ToolAction

    env = AirlineEnv()
    env.reset(TASK)
    res = json.loads(env.step(ToolAction("get_reservation_details", {"reservation_id": "GV1N64"})).observation)
    calls = [
        ("get_reservation_details", {"reservation_id": "GV1N64"}),
        ("get_user_details", {"user_id": res["user_id"]}),
    ]
    completions, observations = [], {}
    for i in range(turns):
        name, args = calls[i % 2]
        observations[name] = env.step(ToolAction(name, args)).observation
        body = json.dumps({"name": name, "arguments": args})
        completions.append(f"Let me look that up for you.\n<tool_call>\n{body}\n</tool_call><|im_end|>")
    completions.append("Your reservation GV1N64 is LAS to DEN on May 19, returning May 20. Anything else?<|im_end|>")
    return completions, observations


class StubServerManager:
    """veRL's `server_manager` with fixed token outputs: the n-th call of a request id gets completion n."""

    def __init__(self, tokenizer, completions, latency: float = 0.0) -> None:
        self.encoded = [tokenizer.encode(c, add_special_tokens=False) for c in completions]
        self.turn: dict[str, int] = defaultdict(int)
        self.latency = latency
        self.calls = 0

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        i = self.turn[request_id]
        self.turn[request_id] += 1
        self.calls += 1
        if self.latency:
            await asyncio.sleep(self.latency)
        ids = self.encoded[min(i, len(self.encoded) - 1)]
        return TokenOutput(
            token_ids=list(ids),
            log_probs=[-0.5] * len(ids),
            stop_reason="completed",
            extra_fields={"global_steps": 0, "min_global_steps": 0, "max_global_steps": 0},
        )


def stub_tools(observations):
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

    from longhaul.envs.prompt import tool_schemas

    class StubTool(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text=observations.get(self.name, "{}")), 0.0, {}

    with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints its schema
        return [StubTool({"type": "native"}, OpenAIFunctionToolSchema(**s)) for s in tool_schemas()]


def build(entry, cfg, server, tokenizer, tools):
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from longhaul.envs.prompt import tool_schemas

    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(tools),
    )
    if tools:
        # the stock loop renders the schemas its tools declare (a pydantic round trip drops their `$defs`): give
        # it the exact schemas longhaul's prompt carries, so both render the same tokens
        loop.tool_schemas = tool_schemas()
    return loop


def rows(n: int, step: int = 1):
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.envs.prompt import build_initial_messages

    raw = build_initial_messages(AirlineEnv().policy_text, EpisodeLimits().date_line, OPENING)
    return [
        {
            "raw_prompt": raw,
            "extra_info": {"task_id": TASK, "index": 0, "seed": 7},
            "index": 0,
            "uid": "bench",
            "session_id": i,
            "global_steps": step,
        }
        for i in range(n)
    ]


async def run_batch(make_loop, batch, sampling):
    cpu0, t0 = time.process_time(), time.perf_counter()
    outs = await asyncio.gather(*[make_loop().run(dict(sampling), **r) for r in batch])
    return outs, time.process_time() - cpu0, time.perf_counter() - t0


def bench_cpu_per_turn(h, cfg, entry, stock_entry, trajectories: int, turns: int, rounds: int) -> dict:
    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop

    tok = h.make_tokenizer()
    completions, observations = script_and_observations(turns)
    tools = stub_tools(observations)
    LonghaulAirlineAgentLoop.make_user_simulator = lambda self, row, seed: h.ScriptedUser(opening=OPENING)
    sampling = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}

    async def one(kind: str):
        server = StubServerManager(tok, completions)
        if kind == "longhaul":
            outs, cpu, wall = await run_batch(lambda: build(entry, cfg, server, tok, []), rows(trajectories), sampling)
            assert all(o.extra_fields["termination"] == "user_stop" for o in outs), [o.extra_fields for o in outs]
        else:
            outs, cpu, wall = await run_batch(
                lambda: build(stock_entry, cfg, server, tok, tools), rows(trajectories), sampling
            )
        assert server.calls == trajectories * (turns + 1), (kind, server.calls)
        return cpu / server.calls, wall, outs

    async def go():
        await one("longhaul")  # warm caches (templates, tokenizer, database views, tool schemas) for both
        await one("stock")
        res = {"longhaul": [], "stock": []}
        for r in range(rounds):
            for kind in ("longhaul", "stock") if r % 2 == 0 else ("stock", "longhaul"):
                per_turn, _, outs = await one(kind)
                res[kind].append(per_turn)
        return res, outs

    res, outs = asyncio.run(go())
    ours, stock = statistics.median(res["longhaul"]), statistics.median(res["stock"])
    return {
        "ours_s": ours,
        "stock_s": stock,
        "ratio": ours / stock,
        "all": res,
        "response_tokens": len(outs[0].response_ids),
    }


@contextlib.contextmanager
def step_cpu_probe(out: list[float]):
    """Record the event-loop thread's own CPU time per callback (a coroutine step): what a step holds the loop for
    by itself, apart from waiting for the GIL that other threads hold."""
    from asyncio import events

    original = events.Handle._run

    def run(handle):
        c0 = time.thread_time()
        original(handle)
        out.append(time.thread_time() - c0)

    events.Handle._run = run
    try:
        yield out
    finally:
        events.Handle._run = original


async def _heartbeat(stop: asyncio.Event, ticks: list[tuple[float, float]]) -> None:
    """Tick every 1 ms; record (time, gap beyond the tick) — the event loop's stalls."""
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        ticks.append((now, now - last - 0.001))
        last = now


def bench_stalls(h, cfg, entry, stock_entry, trajectories: int, turns: int, latency: float) -> dict:
    import httpx

    import longhaul.clients.openai_compat as oc

    tok = h.make_tokenizer()
    completions, observations = script_and_observations(turns)
    tools = stub_tools(observations)
    from support.openai_stub import stub_process

    with stub_process("airline-gold", latency) as url:

        async def batch(per_trajectory_client: bool, stock: bool = False) -> dict:
            server = StubServerManager(tok, completions, latency=latency)
            ticks: list[tuple[float, float]] = []
            spans: list[tuple[float, float]] = []
            stop = asyncio.Event()

            async def trajectory(r):
                t0 = time.perf_counter()
                if stock:
                    out = await build(stock_entry, cfg, server, tok, tools).run(
                        {"temperature": 1.0, "logprobs": True}, **r
                    )
                    spans.append((t0, time.perf_counter()))
                    return out
                loop = build(entry, cfg, server, tok, [])  # veRL's worker builds the loop on its event loop too
                loop.user_settings = {**loop.user_settings, "base_url": url, "model": "user"}
                out = await loop.run({"temperature": 1.0, "logprobs": True}, **r)
                spans.append((t0, time.perf_counter()))
                return out

            beat = asyncio.create_task(_heartbeat(stop, ticks))
            await asyncio.sleep(0.01)
            saved = (oc.shared_chat_client, oc._tls_context)
            if per_trajectory_client:  # before: a ChatClient per trajectory, each pool building its TLS context
                oc.shared_chat_client = lambda base_url, model, **kw: oc.ChatClient(base_url, model, **kw)
                oc._tls_context = httpx.create_ssl_context
            steps: list[float] = []
            try:
                with step_cpu_probe(steps):
                    outs = await asyncio.gather(*[trajectory(r) for r in rows(trajectories)])
            finally:
                oc.shared_chat_client, oc._tls_context = saved
                stop.set()
                await beat
            assert stock or all(o.extra_fields["termination"] == "user_stop" for o in outs)
            worst = [max((g for t, g in ticks if a <= t <= b + 0.001), default=0.0) for a, b in spans]
            return {
                "worst_s": max(worst),
                "median_worst_s": statistics.median(worst),
                "step_cpu_s": max(steps),
                "p99_gap_s": sorted(g for _, g in ticks)[int(0.99 * (len(ticks) - 1))],
                "wall_s": spans,
            }

        async def idle(seconds: float) -> float:
            ticks: list[tuple[float, float]] = []
            stop = asyncio.Event()
            beat = asyncio.create_task(_heartbeat(stop, ticks))
            await asyncio.sleep(seconds)
            stop.set()
            await beat
            return max(g for _, g in ticks)

        async def go():
            # One event loop for everything, as in veRL's long-lived worker: the warm-up batch starts the default
            # executor's threads and fills the caches (templates, database views, the process TLS context).
            await batch(False)
            now = await batch(False)
            spans = now.pop("wall_s")
            base = await idle(max(b for _, b in spans) - min(a for a, _ in spans))  # as long as the batch took
            await batch(False, stock=True)
            stock = await batch(False, stock=True)
            before = await batch(True)
            return now, before, stock, base

        now, before, stock, base = asyncio.run(go())
    return {"now": now, "before": before, "stock": stock, "idle_worst_s": base}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=16, help="concurrent trajectories per batch")
    ap.add_argument("--turns", type=int, default=8, help="tool-call turns per trajectory (+1 final message)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.02, help="seconds per generation and per simulator answer")
    ap.add_argument("--quick", action="store_true", help="fewer trajectories and rounds")
    args = ap.parse_args()
    if args.quick:
        args.trajectories, args.rounds = 4, 1
    os.environ.pop("LONGHAUL_ROLLOUT_DIR", None)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}")
    import logging

    logging.disable(logging.WARNING)
    h = _harness()
    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop

    real_make_user = LonghaulAirlineAgentLoop.make_user_simulator
    with tempfile.TemporaryDirectory() as tmp:
        cfg, entry, stock_entry = compose(Path(tmp))
        c = bench_cpu_per_turn(h, cfg, entry, stock_entry, args.trajectories, args.turns, args.rounds)
        print(
            f"CPU per turn     longhaul {c['ours_s'] * 1e3:8.2f} ms   stock ToolAgentLoop {c['stock_s'] * 1e3:8.2f} ms   "  # noqa: E501 - a string literal kept whole
            f"{c['ratio']:.2f}x (target ≤1.2x; {args.trajectories} concurrent trajectories × {args.turns + 1} turns, "
            f"{c['response_tokens']} response tokens, median of {args.rounds})"
        )
        LonghaulAirlineAgentLoop.make_user_simulator = real_make_user
        s = bench_stalls(h, cfg, entry, stock_entry, args.trajectories, args.turns, args.latency)
        now, before, stock = s["now"], s["before"], s["stock"]
        print(
            f"event-loop stall longhaul {now['worst_s'] * 1e3:8.1f} ms worst (p99 gap {now['p99_gap_s'] * 1e3:.1f} ms)   "  # noqa: E501 - a string literal kept whole
            f"client per trajectory {before['worst_s'] * 1e3:8.1f} ms worst   "
            f"{before['worst_s'] / max(now['worst_s'], 1e-9):.1f}x smaller (target ≤50 ms; {args.trajectories} concurrent "  # noqa: E501 - a string literal kept whole
            f"trajectories; idle heartbeat on this machine: {s['idle_worst_s'] * 1e3:.1f} ms worst)"
        )
        print(
            f"  stock ToolAgentLoop, same loop and stub server: {stock['worst_s'] * 1e3:.1f} ms worst (p99 gap "
            f"{stock['p99_gap_s'] * 1e3:.1f} ms): veRL's tokenizer threads hold the GIL against the loop"
        )
        print(
            f"  longest step on the loop thread (its own CPU, no GIL wait): longhaul {now['step_cpu_s'] * 1e3:.1f} ms   "  # noqa: E501 - a string literal kept whole
            f"client per trajectory {before['step_cpu_s'] * 1e3:.1f} ms   stock {stock['step_cpu_s'] * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
