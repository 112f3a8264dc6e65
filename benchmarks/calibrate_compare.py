"""Calibration of `longhaul compare`'s verdicts, measured through `longhaul.analysis.study.build_statistics` on
simulated studies with a known truth (tests/support/compare_sim.py says how they are drawn). Prints, per layout:

- null studies (`logit` generator, τ²-airline-like: pass^1 ≈ 0.175, flip rate ≈ 0.16; a whole-seed shift of
  ≈ 2.4 points where marked): the overall comparison's type-I error at α = 0.05 — and that of its exact sign-flip
  half alone, what a test blind to whole-seed shifts would give —, its 95% CI's coverage of the truth (0), and
  the false-claim rate of the verdicts: any "better" among overall, train and test, Holm-corrected;
- studies with an effect (logit +0.4, ≈ +6 points): the 95% CI's coverage of the true difference;
- power at the printed MDE (`planning` generator, the model `longhaul power` assumes): the share of studies whose
  verdict says "better" when the true effect is the MDE `longhaul power` prints for that design (target 0.80), and
  the median MDE `build_statistics` printed from the simulated data.

Each rate comes with its Monte Carlo standard error. The unit test (tests/unit/tracking/test_compare_calibration.py)
runs a reduced version of the same measurements.

    python benchmarks/calibrate_compare.py [--sims 1000] [--power-sims 1000] [--seed 2029]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the simulator lives with the tests

from support.compare_sim import Layout, effect_rates, null_rates, power_rates  # noqa: E402

NULL_LAYOUTS = [
    Layout(tasks, seeds, seed_shift=shift, test_tasks=0 if tasks == 10 else 10)
    for tasks in (10, 30, 50)
    for seeds in (1, 3)
    for shift in (False, True)
]
#: (layout, seed SD, baseline, flip rate): designs whose MDE the planning generator can add without clipping.
POWER_LAYOUTS = [
    (Layout(50, 3), 0.024, 0.175, 0.16),
    (Layout(50, 3), 0.0, 0.175, 0.16),
    (Layout(30, 5), 0.024, 0.175, 0.16),
    (Layout(10, 10), 0.024, 0.175, 0.16),
    (Layout(10, 3), 0.024, 0.3, 0.4),
    (Layout(50, 2), 0.0, 0.3, 0.4),
]


def _pct(rate: float, se: float) -> str:
    return f"{rate * 100:5.1f} ± {se * 100:3.1f}"


def main() -> None:
    """Run every layout and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=1000, help="studies per null/effect layout")
    ap.add_argument("--power-sims", type=int, default=1000, help="studies per power layout")
    ap.add_argument("--seed", type=int, default=2029)
    args = ap.parse_args()
    start = time.perf_counter()
    print(f"null and effect studies ({args.sims} each; % ± one Monte Carlo SE)\n")
    print(
        "| layout | type-I error (%) | sign-flip alone (%) | CI coverage, null (%) | false claims, Holm family (%) "
        "| CI coverage, effect (%) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for i, layout in enumerate(NULL_LAYOUTS):
        null = null_rates(layout, args.sims, args.seed + i)
        eff = effect_rates(layout, 0.4, args.sims, args.seed + 100 + i)
        cells = [
            _pct(null.rejection_rate, null.mc_se(null.rejection_rate)),
            _pct(null.task_only_rate, null.mc_se(null.task_only_rate)),
            _pct(null.coverage, null.mc_se(null.coverage)),
            _pct(null.claim_rate, null.mc_se(null.claim_rate)),
            _pct(eff.coverage, eff.mc_se(eff.coverage)),
        ]
        print(f"| {layout} | " + " | ".join(cells) + " |", flush=True)
    print(f"\npower at the printed MDE ({args.power_sims} studies each; target 80%)\n")
    print("| layout | seed SD | baseline, flip rate | planned MDE (points) | median printed MDE | power (%) |")
    print("|---|---:|---|---:|---:|---:|")
    for i, (layout, sd, b, f) in enumerate(POWER_LAYOUTS):
        delta, rates = power_rates(layout, sd, args.power_sims, args.seed + 200 + i, b, f)
        printed = statistics.median(rates.mdes) * 100
        pw = rates.overall_claim_rate
        design = f"{layout.tasks} tasks × {layout.seeds} seeds × {layout.samples} samples"
        print(
            f"| {design} | {sd * 100:.1f} | {b:g}, {f:g} | {delta * 100:.1f} | {printed:.1f} | "
            f"{_pct(pw, rates.mc_se(pw))} |",
            flush=True,
        )
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
