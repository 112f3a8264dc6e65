"""CLI start-up and memory, measured side by side in one run on this machine (issue #32 item 6).

    python benchmarks/bench_cli.py [--runs 11] [--rss-runs 3] [--keep DIR]

1. Wall time (median of `--runs` fresh processes, the commands taken in turn so a busy moment hits them all) of
   `python -c "import pydantic, yaml"` (the baseline: an interpreter that can read a spec), `longhaul --help` and
   `longhaul validate specs/smoke.yaml`, each as a ratio to the baseline (targets: --help <= 2x, validate <= 4x).
   Beside them, for reference: the floor any typer CLI with rich help pays (`typer-floor --help`: one command,
   no longhaul), and `import longhaul.cli` alone.
2. Peak resident memory (`getrusage(RUSAGE_CHILDREN).ru_maxrss` of a fresh wrapper process per run, the largest
   of `--rss-runs`) and median wall time of `longhaul explain`, `longhaul compare` and `longhaul sft inspect` on
   ordinary inputs built first in a temporary directory: 16 episodes of the production episode runner (task 5's
   gold calls, half with a wrong call) for explain; two 3-seed arms evaluated on 16 tasks x 4 trials in a sqlite
   MLflow store (`tests/support/tracking_runs.populate_seed_study`) for compare; a dataset of the gold
   conversations of 10 training tasks with a BPE tokenizer trained on the airline text for sft inspect.

No thresholds are asserted: the numbers are printed (the unit tests check which modules start-up imports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SMOKE = "specs/smoke.yaml"
TARGETS = {"longhaul --help": 2.0, "longhaul validate specs/smoke.yaml": 4.0}
#: A typer app with one command and the CLI's settings: what `--help` costs before longhaul adds anything.
TYPER_FLOOR = (
    "import typer\n"
    "app = typer.Typer(name='floor', no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)\n"
    "@app.callback()\n"
    "def root(debug: bool = typer.Option(False, '--debug', help='Show tracebacks.')) -> None:\n"
    "    'A CLI.'\n"
    "@app.command()\n"
    "def validate(path: str) -> None:\n"
    "    'Validate a file.'\n"
    "app()\n"
)
#: Runs argv in a child and prints the child's peak RSS in KiB (Linux `ru_maxrss`) on the last stdout line.
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode\n"
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def longhaul_argv() -> list[str]:
    """The installed console script beside this interpreter, else `python -m longhaul.cli`."""
    script = Path(sys.executable).with_name("longhaul")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "longhaul.cli"]


def run_once(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run; fails loudly if the command fails (a benchmark of an error says nothing)."""
    t = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return dt


def peak_rss_kib(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
    """(peak RSS in KiB, wall seconds) of one run of argv in a fresh wrapper process."""
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", RSS_WRAPPER, *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    dt = time.perf_counter() - t
    rc, kib = proc.stdout.split()[-2:]
    if rc != "0":
        raise SystemExit(f"{' '.join(argv)} exited {rc}")
    return int(kib), dt


def time_commands(commands: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Each command `runs` times, taken in turn; one untimed warm-up round first (file cache, .pyc)."""
    for argv in commands.values():
        run_once(argv, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(run_once(argv, env))
    return times


def build_explain_input(work: Path) -> Path:
    """16 trajectory records of the production episode runner (one group): task 5, half with a wrong call."""
    from support.episodes import gold_episode

    path = work / "trajectories.jsonl"
    records = [gold_episode(trial, bad_call=trial % 2 == 1) for trial in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def build_compare_input(work: Path) -> str:
    """A sqlite MLflow store holding two 3-seed arms, each seed run evaluated once; returns its URI."""
    from support.tracking_runs import populate_seed_study

    store = work / "mlflow" / "mlflow.db"
    store.parent.mkdir(parents=True)
    uri = f"sqlite:///{store}"
    populate_seed_study(uri, work / "runs")
    return uri


def build_sft_input(work: Path) -> Path:
    """A dataset parquet of 10 training tasks' gold conversations (tool results as the environment returns them),
    with its stats file naming a BPE tokenizer trained on the airline policy, tool schemas and those turns."""
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.airline.tasks import load_tasks, policy_text
    from longhaul.envs.prompt import build_initial_messages, tool_schemas
    from longhaul.sft.dataset import build_sft_rows, write_dataset
    from longhaul.tiny.gold import build_gold_conversation, closing_message, first_user_message, gold_actions
    from longhaul.tiny.inputs import default_date_line, gold_results
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    tasks, policy, tools = load_tasks(), policy_text(), tool_schemas()
    records = []
    for tid in build_split("seed_40_10").train[:10]:
        raw = tasks[tid].raw
        actions = gold_actions(raw)
        results = gold_results(tid, actions)
        initial = build_initial_messages(policy, default_date_line(), first_user_message(raw))
        messages = build_gold_conversation(initial, actions[: len(results)], results, closing_message(raw))
        records.append({"task_id": tid, "attempt": 0, "messages": messages, "tools": tools})
    corpus = [policy, *(json.dumps(t) for t in tools)]
    corpus += [m["content"] for r in records for m in r["messages"] if m.get("content")]
    tokenizer = build_hf_tokenizer(corpus, vocab_size=2000)
    tok_dir = work / "tokenizer"
    tokenizer.save_pretrained(tok_dir)
    rows, _dropped, stats = build_sft_rows(tokenizer, records, max_length=32768, min_label_tokens=1)
    dataset = work / "sft.parquet"
    write_dataset(rows, dataset, stats, tokenizer=str(tok_dir))
    return dataset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per start-up command (median shown)")
    parser.add_argument("--rss-runs", type=int, default=3, help="runs per memory command (largest RSS shown)")
    parser.add_argument("--keep", type=Path, help="build the inputs in this directory and keep them")
    args = parser.parse_args(argv)

    env = {**os.environ, "COLUMNS": "100", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cli = longhaul_argv()
    py = sys.executable
    startup = {
        'python -c "import pydantic, yaml"': [py, "-c", "import pydantic, yaml"],
        "typer-floor --help": [py, "-c", TYPER_FLOOR, "--help"],
        'python -c "import longhaul.cli"': [py, "-c", "import longhaul.cli"],
        "longhaul --help": [*cli, "--help"],
        "longhaul validate specs/smoke.yaml": [*cli, "validate", "specs/smoke.yaml"],
    }
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} CPUs; {args.runs} runs each, median")
    times = time_commands(startup, args.runs, env)
    base = statistics.median(times['python -c "import pydantic, yaml"'])
    print(f"{'command':<40} {'median':>9} {'min':>9} {'ratio':>7}  target")
    for name, ts in times.items():
        med = statistics.median(ts)
        target = f"<= {TARGETS[name]:.0f}x" if name in TARGETS else ""
        print(f"{name:<40} {med:8.3f}s {min(ts):8.3f}s {med / base:6.2f}x  {target}")

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_cli_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        trajectories = build_explain_input(work)
        uri = build_compare_input(work)
        dataset = build_sft_input(work)
        print(f"\ninputs built in {time.perf_counter() - t:.1f}s under {work}")
        compare_out = str(work / "comparison")
        memory = {
            'python -c "import pydantic, yaml"': [py, "-c", "import pydantic, yaml"],
            "longhaul --help": [*cli, "--help"],
            "longhaul explain (16 episodes, smoke spec)": [*cli, "explain", str(trajectories), "--spec", SMOKE],
            "longhaul compare (2 arms x 3 seeds)": [*cli, "compare", "--tracking-uri", uri, "--out", compare_out],
            "longhaul sft inspect (10 conversations)": [*cli, "sft", "inspect", str(dataset), "--plain"],
        }
        print(f"{'command':<45} {'peak RSS':>10} {'median':>9}")
        for name, command in memory.items():
            results = [peak_rss_kib(command, env) for _ in range(args.rss_runs)]
            kib = max(r[0] for r in results)
            wall = statistics.median(r[1] for r in results)
            print(f"{name:<45} {kib / 1024:7.0f} MiB {wall:8.2f}s")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
