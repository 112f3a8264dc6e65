"""veRL's trainer modes side by side under a long-tailed user simulator: sync against colocate_async on CPU.

For each training seed and each trainer mode (`spec.algorithm.trainer.mode`) it runs `longhaul run` on a copy of
the spec (default specs/demo.yaml) in a fresh run directory — the real pipeline: veRL's `main_ppo` on its CPU
platform, longhaul's agent loop, merge, evaluation of step 0 and of the last step — and measures, from what the
run leaves (veRL's step metrics in the run's MLflow store, the rollout traces, the launcher's log, the eval
stage's records): trained trajectories per minute (over veRL's summed `timing_s/step`, and over the grpo stage's
wall clock), the rollout's share of step time (`timing_s/gen` / `timing_s/step`), the longest conversation (the
slowest trajectory's wall time in the rollout traces), staleness (`trajectory_staleness_worst/max`, the console's
`stale` column) and `trajectory_spans/max`, and pass^1 on the training tasks at step 0 and at the last step. It
prints one table with the modes as columns, each async mode's throughput as a multiple of sync's and the paired
difference of its last-step pass^1 against sync's (`longhaul.eval.stats.paired_difference`: both runs meet the
same simulated customers on the same tasks), and writes every figure to `<out>/bench_async.json`. The target
(issue #33: an async mode trains ≥ 1.5× the trajectories per minute of sync at a pass^1 not worse than sync's
beyond the paired CI) is reported, not asserted: this is a measurement, not a timed test.

The user simulator behind a latency proxy (`benchmarks/latency_proxy.py`, where the choice of a lognormal is
argued): overlapping rollout with training pays off when conversations wait on something other than the policy —
on GPU, mostly a 72B user simulator. Here the real tiny simulator (vLLM-CPU, started once per benchmark from the
launch plan the launcher itself would use: `longhaul.render.plan`, `longhaul.launcher.servers.ManagedServer`)
answers behind an HTTP reverse proxy that holds every request for a delay drawn from a lognormal
(`--latency-median` seconds, `--latency-sigma` of the log) before forwarding it unchanged; its p50/p90/p99, the
RNG seed and the delays actually drawn are printed. The figures and the table are `benchmarks/async_figures.py`.

separate_async runs only where the spec takes it: on a CPU spec the product's own refusal is printed instead.

Needs what `make demo` sets up (`make install`, `longhaul tiny build`). Runs the pipelines one after another.

    python benchmarks/bench_async.py [--seeds 1] [--modes sync,colocate_async] [--steps 4] [--small]
        [--latency-median 1.0] [--latency-sigma 1.0] [--latency-seed 0] [--spec specs/demo.yaml] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from async_figures import (
    SPANS,
    STALE,
    STEP_KEYS,
    SYNC,
    TARGET_RATIO,
    fmt,
    format_table,
    mode_figures,
    paired_cell,
    run_spec,
    shrink,
    simulator_spec,
    table_rows,
    target_met,
    throughput_ratios,
)
from latency_proxy import LatencyProxy, LatencySampler, empirical_quantiles, theory_quantiles
from pipeline_runs import ROOT, evaluation_records, run_pipeline

from longhaul.render.plan import LOOPBACK

DEFAULT_MODES = "sync,colocate_async"
#: The launcher's line at the end of the grpo stage (`longhaul.launcher.supervisor`), in logs/launcher.log.
STAGE_DONE = re.compile(r"stage grpo: done in (\d+(?:\.\d+)?) s")


# ------------------------------------------------------------------------------------------------------------
# The simulator server, the runs, and what they leave (I/O)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def start_simulator(doc: Mapping[str, Any], work: Path) -> Any:
    """Start the spec's user-simulator server as the launcher would (its `ServerPlan` from `render_plan`, started
    and health-checked by `ManagedServer`), logging to `<work>/simulator/logs/simulator.log`; returns it
    healthy. The servers' interpreter is chosen as the launcher chooses it ($LONGHAUL_VLLM_PYTHON, else this one)."""
    from longhaul import constants as C
    from longhaul.launcher.servers import ManagedServer
    from longhaul.render.plan import render_plan
    from longhaul.spec.load import parse_spec_text

    sim_dir = work / "simulator"
    sim_dir.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(simulator_spec(doc, free_port()), sort_keys=False)
    (sim_dir / "simulator-spec.yaml").write_text(text)
    exp = parse_spec_text(text, str(sim_dir / "simulator-spec.yaml"))
    python = os.environ.get(C.ENV_VLLM_PYTHON) or sys.executable
    plan = render_plan(exp, "local", str(sim_dir), server_python=python)
    assert plan.simulator is not None, "the simulator spec is colocated: the plan has its server"
    server = ManagedServer(plan.simulator, {**os.environ, **plan.env}, sim_dir / "logs")
    server.start()
    try:
        took = server.wait_healthy()
    except BaseException:
        server.stop()
        raise
    print(f"simulator server {plan.simulator.base_url} healthy after {took:.0f} s (pid {server.process.pid})")
    return server


def read_step_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """veRL's step metrics (`STEP_KEYS`) of the run, from its local MLflow store (`fetch_step_metrics`)."""
    from longhaul.layout import MLFLOW_RUN_FILE, MLFLOW_STORE_FILE
    from longhaul.tracking.config import local_store_uri
    from longhaul.tracking.runs import fetch_step_metrics

    run_id = json.loads((run_dir / MLFLOW_RUN_FILE).read_text())["run_id"]
    return fetch_step_metrics(local_store_uri(run_dir / MLFLOW_STORE_FILE), run_id, STEP_KEYS)


def read_conversation_waits(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per trained step, the slowest trajectory's wall time (`timing.total`: from the agent loop's start of the
    episode to its end, pauses for weight updates included) and the trajectories traced, from the rollout
    traces (`longhaul.tracking.traces.read_training_steps`)."""
    from longhaul.layout import Paths
    from longhaul.tracking.traces import read_training_steps

    out: dict[int, dict[str, float]] = {}
    for step, lines in read_training_steps(Paths.under(str(run_dir)).rollouts_dir):
        totals = [float(t) for rec in lines if (t := (rec.get("timing") or {}).get("total")) is not None]
        if totals:
            out[step] = {"longest_s": max(totals), "traced": len(lines)}
    return out


def read_stage_wall(run_dir: Path) -> float | None:
    """The grpo stage's wall clock (s) from the launcher's `stage grpo: done in N s` line (the launcher records
    it nowhere else)."""
    from longhaul.layout import LAUNCHER_LOG

    log = run_dir / LAUNCHER_LOG
    found = STAGE_DONE.findall(log.read_text(errors="replace")) if log.is_file() else []
    return float(found[-1]) if found else None


def measure_run(run_dir: Path) -> dict[str, Any]:
    """What one finished run left: veRL's step metrics, the slowest trajectory per step, the grpo stage's wall
    clock, and the evaluation records of step 0 and of the last checkpoint."""
    from longhaul.checkpoints import saved_steps
    from longhaul.layout import Paths

    last = saved_steps(Paths.under(str(run_dir)).checkpoint_dir)[-1]
    return {
        "steps": read_step_metrics(run_dir),
        "waits": read_conversation_waits(run_dir),
        "grpo_wall_s": read_stage_wall(run_dir),
        "last_step": last,
        "records": {0: evaluation_records(run_dir, 0), last: evaluation_records(run_dir, last)},
    }


# ------------------------------------------------------------------------------------------------------------
# pass^1 and the paired difference (the product's statistics)


def _arm(runs: Sequence[Mapping[str, Any]], mode: str, which: str) -> Any:
    """The training tasks' outcomes of `mode`'s runs at step 0 (`which="first"`) or their last step, one seed per
    training seed, as `longhaul compare` builds them (`longhaul.analysis.study.arm_outcomes`)."""
    from longhaul.analysis.study import Arm, SeedEval, arm_outcomes
    from longhaul.eval.metrics import TrialRecord

    seeds = []
    for r in runs:
        step = 0 if which == "first" else r["last_step"]
        records = tuple(TrialRecord.from_dict(x) for x in r["records"][step])
        seeds.append(SeedEval(r["seed"], f"{mode}-seed{r['seed']}", step, "last evaluated", records))
    return arm_outcomes(Arm(mode, mode, "grpo", tuple(seeds)), "train")


def pass_rates(runs: Sequence[Mapping[str, Any]], mode: str) -> dict[str, float]:
    """pass^1 on the training tasks at step 0 and at the last step, over the mode's runs."""
    from longhaul.eval.stats import rate

    return {f"pass1_{w}": rate(_arm(runs, mode, w), 1, "pass_hat") for w in ("first", "last")}


def paired_against_sync(runs: Mapping[str, Sequence[Mapping[str, Any]]], mode: str, seed: int) -> dict[str, Any]:
    """Last-step pass^1 of `mode` minus sync's on the training tasks, paired by task
    (`longhaul.eval.stats.paired_difference`), with the number of training seeds behind it."""
    from longhaul.eval.stats import paired_difference

    p = paired_difference(
        _arm(runs[SYNC], SYNC, "last"), _arm(runs[mode], mode, "last"), 1, "pass_hat", np.random.default_rng(seed)
    )
    return {"diff": p.diff, "ci": list(p.ci), "p": p.p_value, "tasks": p.tasks, "seeds": len(runs[mode])}


# ------------------------------------------------------------------------------------------------------------
# main


def _args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1", help="training seeds, comma-separated")
    ap.add_argument("--modes", default=DEFAULT_MODES, help="trainer modes, comma-separated (sync first)")
    ap.add_argument("--steps", type=int, default=4, help="training steps per run")
    ap.add_argument("--warmup-batches", type=float, default=1.0, help="async modes' warmup_batches")
    ap.add_argument("--latency-median", type=float, default=1.0, help="simulator reply delay median (s)")
    ap.add_argument("--latency-sigma", type=float, default=1.0, help="log-standard deviation of the delay")
    ap.add_argument("--latency-seed", type=int, default=0, help="seed of the proxy's delay RNG")
    ap.add_argument("--small", action="store_true", help="shrink the spec to the smallest that trains")
    ap.add_argument("--spec", default=str(ROOT / "specs" / "demo.yaml"))
    ap.add_argument("--out", default=None, help="work directory (default: a new temporary one)")
    return ap.parse_args(argv)


def separate_async_refusal(doc: Mapping[str, Any]) -> str:
    """Why separate_async is not run here: the product's own refusal of the benchmark's spec in that mode (on a
    CPU spec, the one-line error of `longhaul.spec.trainer_mode`); empty when the spec would take it."""
    from longhaul.spec.load import SpecError, parse_spec_text

    spec = run_spec(doc, "separate_async", 1, 1, 1.0, "http://127.0.0.1:1/v1")
    try:
        parse_spec_text(yaml.safe_dump(spec, sort_keys=False), "separate_async.yaml")
    except SpecError as exc:
        return f"separate_async: not run — the spec refuses it: {exc}"
    return ""


def _modes(arg: str) -> list[str]:
    modes = [m.strip() for m in arg.split(",") if m.strip()]
    return [SYNC, *[m for m in modes if m != SYNC]] if SYNC in modes else modes


def _run_all(args: argparse.Namespace, doc: dict, modes: list[str], seeds: list[int], work: Path) -> tuple:
    """Start the simulator and the proxy, run every (seed, mode), stop both; (runs per mode, proxy delays)."""
    server = start_simulator(doc, work)
    sampler = LatencySampler(args.latency_median, args.latency_sigma, args.latency_seed)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    upstream = f"http://{server.plan.host}:{server.plan.port}"
    try:
        with LatencyProxy(upstream, sampler) as proxy:
            _probe(proxy.base_url + "/v1/models")
            print(f"latency proxy {proxy.base_url} -> {upstream} (GET /v1/models through it: 200)", flush=True)
            for seed in seeds:
                for mode in modes:
                    spec = run_spec(doc, mode, seed, args.steps, args.warmup_batches, proxy.base_url + "/v1")
                    runs[mode].append(_one_run(spec, mode, seed, work))
            delays = list(proxy.delays)
    finally:
        server.stop()
    return runs, delays


def _probe(url: str) -> None:
    """GET `url` (through the proxy: what the agent loop's readiness wait asks); raise unless it answers 200."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered HTTP {r.status}")


def _one_run(spec: Mapping[str, Any], mode: str, seed: int, work: Path) -> dict[str, Any]:
    name = f"{mode}-seed{seed}"
    print(f"{name}: running (log {work / (name + '.log')})", flush=True)
    run_dir, rc, wall = run_pipeline(spec, name, work)
    row: dict[str, Any] = {"mode": mode, "seed": seed, "run_dir": str(run_dir), "wall_s": wall, "rc": rc}
    if rc != 0:
        row["error"] = f"longhaul run exited {rc}; see {work / (name + '.log')} and {run_dir / 'logs'}"
    else:
        try:
            row.update(measure_run(run_dir))
        except Exception as exc:  # noqa: BLE001 - one unreadable run must not lose the others' figures
            row["error"] = f"could not read the run's results: {type(exc).__name__}: {exc}"
    print(f"{name}: {'FAILED: ' + row['error'] if 'error' in row else 'done'} ({wall / 60:.1f} min)", flush=True)
    return row


def _figures(runs: Mapping[str, list[dict]], per_step: int) -> tuple[dict, dict]:
    """Per mode its figures (and pass^1), and per async mode the paired difference against sync."""
    figures, paired = {}, {}
    for mode, rows in runs.items():
        ok = [r for r in rows if "error" not in r]
        walls = [r["grpo_wall_s"] for r in ok]
        f = mode_figures(
            [m for r in ok for m in r["steps"].values()],
            per_step,
            walls if walls and None not in walls else [],  # trajectories over wall: every run's wall or none
            # trained steps only (an async trainer may have prefetched rollouts for a step it never trained)
            [w["longest_s"] for r in ok for step, w in r["waits"].items() if step in r["steps"]],
        )
        f.update(runs=len(rows), runs_ok=len(ok), run_wall_s=sum(r["wall_s"] for r in rows))
        if ok:
            f.update(pass_rates(ok, mode))
        figures[mode] = f
    good = {m: [r for r in rows if "error" not in r] for m, rows in runs.items()}
    for mode in runs:
        if mode != SYNC and good.get(SYNC) and good[mode]:
            paired[mode] = paired_against_sync(good, mode, seed=0)
    return figures, paired


def _report(figures: dict, paired: dict, modes: list[str], n_seeds: int) -> dict:
    """Print the table, the target's verdict per async mode and the separate_async note; returns the ratios."""
    ratios = throughput_ratios(figures)
    print(format_table(modes, table_rows(figures, ratios, paired)))
    waits = {f["longest_conversation_source"] for f in figures.values() if f.get("steps")}
    print(f"longest conversation: {', '.join(sorted(waits)) or '-'}; staleness: veRL's {STALE}; spans: {SPANS}")
    for mode in modes:
        if mode == SYNC:
            continue
        ratio, p = ratios.get(mode, {}).get("traj_per_min_step"), paired.get(mode)
        verdict = "met" if target_met(ratio, p["ci"] if p else None) else "NOT met"
        print(
            f"target ({mode}: ≥ {TARGET_RATIO}× sync's trajectories/min at last-step pass^1 not worse than sync's "
            f"beyond the paired 95% CI): {verdict} — {fmt(ratio, '.2f', '×')} by veRL step time, "
            f"{fmt(ratios.get(mode, {}).get('traj_per_min_wall'), '.2f', '×')} by grpo stage wall; pass^1 "
            f"difference {paired_cell(p)} over {p['tasks'] if p else 0} training tasks, n seeds = {n_seeds}"
        )
    return ratios


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (module docstring); 0 when every run finished, 1 otherwise, 2 when not set up."""
    from longhaul.machine import machine_line

    args = _args(argv)
    seeds, modes = [int(s) for s in args.seeds.split(",") if s.strip()], _modes(args.modes)
    doc = yaml.safe_load(Path(args.spec).read_text())
    doc = shrink(doc) if args.small else doc
    refusal = separate_async_refusal(doc)
    if refusal:  # the CPU specs: veRL's separate_async needs an NCCL/NIXL checkpoint engine
        modes = [m for m in modes if m != "separate_async"]
    for role in ("policy", "user_simulator"):
        if not (ROOT / doc["spec"][role]["model"]["path"]).is_dir():
            print("needs `make install` and `longhaul tiny build` (make demo does both)", file=sys.stderr)
            return 2
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-async-"))
    work.mkdir(parents=True, exist_ok=True)
    a = doc["spec"]["algorithm"]
    per_step = int(a["train_batch_size"]) * int(a["group_size"])
    theory = theory_quantiles(args.latency_median, args.latency_sigma)
    print(
        f"spec {args.spec}{' (--small)' if args.small else ''}; modes {modes}; seeds {seeds}; {args.steps} steps "
        f"× {per_step} trajectories; work dir {work}"
    )
    print(f"machine: {machine_line()}")
    print(
        f"simulator latency: lognormal median {args.latency_median:g} s, sigma {args.latency_sigma:g}, seed "
        f"{args.latency_seed}; " + ", ".join(f"{k} {v:.2f} s" for k, v in theory.items())
    )
    t0 = time.monotonic()
    runs, delays = _run_all(args, doc, modes, seeds, work)
    drawn = empirical_quantiles(delays)
    print(f"proxy delays drawn: {len(delays)}; " + ", ".join(f"{k} {v:.2f} s" for k, v in drawn.items()))
    figures, paired = _figures(runs, per_step)
    ratios = _report(figures, paired, modes, len(seeds))
    print(refusal or "separate_async: runs on this spec (pass --modes to include it)")
    result = {
        "args": vars(args),
        "machine": machine_line(),
        "modes": modes,
        "seeds": seeds,
        "latency": {"theory": theory, "drawn": drawn, "count": len(delays)},
        "figures": figures,
        "ratios": ratios,
        "paired": paired,
        "separate_async": refusal,
        "wall_s": time.monotonic() - t0,
        "runs": {m: [{k: v for k, v in r.items() if k != "records"} for r in rows] for m, rows in runs.items()},
    }
    out = work / "bench_async.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"figures: {out}; total wall {result['wall_s'] / 60:.1f} min")
    return 0 if all("error" not in r for rows in runs.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
