"""Does the tiny build carry between machines? Its recipe under several perturbations, criteria side by side.

Another CPU rounds differently, and a warm start of hundreds of steps turns those last bits into other weights
(`longhaul.tiny.arithmetic`). What must carry is not the bits but the habits the demo depends on: the build's
criteria (`longhaul.tiny.checks`) and, with `--step0`, the demo's step-0 pass^1. This runs the recipe
(`longhaul.tiny.build.run_recipe`, the build's own child process) under each perturbation:

- another seed (`--seeds`): other initial weights and data order, a larger perturbation than rounding;
- another machine's kernels, emulated on this CPU (`native`: this CPU's own): `mkl-sse42`, MKL's matrix
  products dispatched to SSE4.2 (other widths, other sums); `mkl-avx2` the same at AVX2 (differs from `native`
  on a CPU with AVX-512);

and prints each build's criteria, whether it meets them all, and the range of each criterion. With `--step0` each
build's models are also evaluated as the demo's step 0 (`longhaul run specs/demo.yaml --stage eval` on a copy of
the spec that names the build's models: the initial policy on the 12 training and 6 test tasks, 4 samples each),
the figure `make demo` starts from. Builds are gated as the project's is, on the demo's step-0 estimate too
(`--ungated`: without it, the recipe before #31 item 2). With `--estimate` the same step-0 evaluation on the
training tasks also runs in-process on the finished build (`longhaul.tiny.local_chat.step0_estimate`: transformers
instead of the vLLM servers, everything else the evaluation's own); side by side with `--step0` it shows whether
that estimate predicts the demo's start. Reported, not asserted: a measurement (4-13 min a build, 4 more with
`--step0`, 2 more with `--estimate`, on 2 cores).

    python benchmarks/bench_tiny_robustness.py [--seeds 7,8,9] [--kernels native,mkl-sse42] [--step0] [--estimate]
        [--ungated] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from longhaul.machine import machine_line
from longhaul.tiny.build import POLICY_DIRNAME, USER_DIRNAME, TinyBuildConfig, run_recipe
from longhaul.tiny.checks import criteria
from longhaul.tiny.local_chat import LocalChat, step0_estimate

ROOT = Path(__file__).resolve().parents[1]
DEMO_SPEC = ROOT / "specs" / "demo.yaml"
#: Kernel selections a build runs under: this CPU's own, and an older CPU's emulated on this one.
KERNELS = {
    "native": {},
    "mkl-sse42": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def _demo_spec(build: Path, work: Path) -> Path:
    """specs/demo.yaml naming the build's models."""
    doc = yaml.safe_load(DEMO_SPEC.read_text())
    doc["metadata"]["name"] = f"demo-{build.name}"
    doc["spec"]["policy"]["model"]["path"] = str(build / POLICY_DIRNAME)
    doc["spec"]["user_simulator"]["model"]["path"] = str(build / USER_DIRNAME)
    spec = work / f"demo-{build.name}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return spec


def _estimate(build: Path, work: Path) -> str:
    """The build's in-process step-0 estimate on the training tasks as "value (c/n)"."""
    from longhaul.spec import load_spec

    policy, user = LocalChat.load(build / POLICY_DIRNAME, "policy"), LocalChat.load(build / USER_DIRNAME, "user")
    found = step0_estimate(load_spec(_demo_spec(build, work)), policy, user)
    return f"{found['train_pass1']:.3f} ({found['c_over_n']})"


def _step0(build: Path, work: Path) -> dict[str, float | str]:
    """pass^1 of the build's models as the demo's step 0, on the training and test tasks (the eval stage's
    summary), and how the evaluated episodes ended."""
    from longhaul.layout import EVAL_SUMMARY_FILE, Paths

    spec = _demo_spec(build, work)
    run_dir = work / f"eval-{build.name}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    env.setdefault("LONGHAUL_VLLM_PYTHON", sys.executable)
    longhaul = Path(sys.executable).parent / "longhaul"
    argv = [str(longhaul), "run", str(spec), "--stage", "eval", "--run-dir", str(run_dir)]
    with (work / f"eval-{build.name}.log").open("w") as log:
        proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        return {"error": f"eval exited {proc.returncode} (log: {work / f'eval-{build.name}.log'})"}
    summary = json.loads((Path(Paths.under(str(run_dir)).eval_step_dir(0)) / EVAL_SUMMARY_FILE).read_text())
    return summary


def _pass1(summary: dict, subset: str) -> str:
    """pass^1 on `subset` as "value (c/n)", or "-" when the evaluation did not run."""
    block = (summary.get("subsets") or {}).get(subset)
    if not block:
        return "-"
    return f"{block['pass_hat_k']['1']:.3f} ({block['c_over_n']})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="7,8,9", help="build seeds (7 is the build's own)")
    ap.add_argument("--kernels", default="native", help=f"kernel selections: {', '.join(KERNELS)}")
    ap.add_argument("--step0", action="store_true", help="also evaluate each build as the demo's step 0")
    ap.add_argument(
        "--ungated", action="store_true", help="builds without the step-0 criterion (the recipe before #31 item 2)"
    )
    ap.add_argument("--estimate", action="store_true", help="also run the in-process step-0 estimate of each build")
    ap.add_argument("--out", type=Path, default=None, help="work directory (default: a fresh temporary one)")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    kernels = args.kernels.split(",")
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        ap.error(f"--kernels: unknown {unknown}; use {', '.join(KERNELS)}")
    work = args.out or Path(tempfile.mkdtemp(prefix="bench-tiny-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine_line()}\nwork: {work}\n", flush=True)
    rows = []
    for seed in seeds:
        for kernel in kernels:
            build = work / f"seed{seed}-{kernel}"
            env = {k: v for k, v in os.environ.items() if k != "MKL_ENABLE_INSTRUCTIONS"}
            t = time.perf_counter()
            config = replace(TinyBuildConfig(), seed=seed, step0_spec=None if args.ungated else str(DEMO_SPEC))
            report = run_recipe(build, config, lambda _l: None, {**env, **KERNELS[kernel]})
            wall = time.perf_counter() - t
            checked = criteria(report["tool_calls"], report["user_check"])
            row = {"seed": seed, "kernels": kernel, "wall_s": round(wall), **{c.name: c for c in checked}}
            if args.step0:
                row["step0"] = _step0(build, work)
            if args.estimate:
                row["estimate"] = _estimate(build, work)
            rows.append(row)
            cells = "  ".join(f"{c.name}={c.value:.3f}{'' if c.met else ' (NOT MET)'}" for c in checked)
            verdict = "all met" if all(c.met for c in checked) else "MISSED"
            steps = f"policy {report['warmstart']['steps']} / simulator {report['user_warmstart']['steps']} steps"
            if args.step0:
                cells += f"  step-0 pass^1 train {_pass1(row['step0'], 'train')} test {_pass1(row['step0'], 'test')}"
            if args.estimate:
                cells += f"  in-process estimate, train {row['estimate']}"
            print(f"seed {seed} {kernel:<6} {wall:5.0f}s  {steps}  {verdict}  {cells}", flush=True)
    names = [k for k in rows[0] if k not in {"seed", "kernels", "wall_s", "step0", "estimate"}]
    print("\nrange over builds (criterion: min .. max, met n/N):")
    for name in names:
        values = [r[name].value for r in rows]
        met = sum(r[name].met for r in rows)
        print(f"  {name:<30} {min(values):.3f} .. {max(values):.3f}   met {met}/{len(rows)}")
    if args.step0:
        for subset in ("train", "test"):
            vals = [float(v.split()[0]) for r in rows if (v := _pass1(r["step0"], subset)) != "-"]
            if vals:
                print(f"  step-0 pass^1 {subset:<16} {min(vals):.3f} .. {max(vals):.3f}   ({len(vals)} builds)")
    (work / "results.json").write_text(
        json.dumps([{k: (v.value if hasattr(v, "value") else v) for k, v in r.items()} for r in rows], indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
