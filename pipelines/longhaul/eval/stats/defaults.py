"""The defaults of longhaul's statistics — the one place they live. Every other module of `longhaul.eval.stats`,
`longhaul compare` and `longhaul power` reads them from here."""

from __future__ import annotations

#: Significance level of every test and the two-sided CI that goes with it (the conventional 5%). A family of
#: verdicts shares it through Holm's correction (`longhaul.eval.stats.verdict.holm`).
ALPHA = 0.05

#: Target power of a planned study (the conventional 80%; issue 14 asks for the MDE at 80% power).
POWER = 0.80

#: Bootstrap replicates per estimate (the CIs of one arm's rates and of `paired_difference`): the Monte Carlo
#: error of a 95% percentile bound is ≈ 0.06 standard errors (≈ 0.2 points at 50 tasks × 4 samples).
BOOTSTRAP_SAMPLES = 2000

#: The original ablation's baseline: vanilla GRPO step 200, pass^1 = 0.175 on 50 tasks × 4 samples
#: (notes/method.md g.1, g.2; the headline compares it with PRM-Lite+LATA step 250, 0.240).
DEFAULT_BASELINE = 0.175

#: Flip rate f between two runs of one configuration: the fraction of outcomes (same task, one sample each)
#: that differ. τ²-bench issue #540 (released trajectories, airline, 50 tasks) finds that two single runs
#: must differ by 5.5–11 points to be told apart; with one sample per task a run's score has variance
#: (f/2)/T, so d = 1.96·√(f/T) gives f = T·(d/1.96)² = 0.04–0.16. We take the upper end: the original's own
#: base model (pass^1 0.160, pass@4 0.340; method.md g.1) fits f ≈ 0.19 under a two-point task model, so 0.16
#: is not pessimistic for it. (The issue's "10–42% of tasks flip" counts tasks whose verdict changes at least
#: once over four runs — a different, larger number than this per-outcome pairwise rate.)
DEFAULT_FLIP_RATE = 0.16

#: Seed SD σ_seed: the standard deviation of a whole training run's shift of pass^1 — every task of one seed up
#: or down together —, as a fraction (0.024 = 2.4 points). Used where it cannot be measured (an arm with one
#: seed: `longhaul compare` then widens its CI by it and gives no verdict) and by `longhaul power`. 2.4 points is
#: an assumed modest seed effect (the size a review of this project's statistics used) at the baseline 0.175
#: (≈ 0.3 on the logit scale at τ²-airline's spread of task difficulty). The project's own multi-seed runs cannot
#: pin it: the three seeds of the CPU demo
#: (benchmarks/bench_learning.py; README "Does the demo learn?") scored train pass^1 0.938, 0.854 and 0.896 on
#: 48 outcomes each — a spread (SD 4.2 points) that 48 outcomes' sampling noise alone gives (≤ 4.4 points), so
#: their seed-wide SD estimates to 0 on a toy task near its ceiling. Measure yours: `longhaul compare` on ≥ 2
#: seeds per arm measures it and writes it to `design.json`.
DEFAULT_SEED_SD = 0.024

#: Bounds of the search in `required_design`.
MAX_SEEDS = 1000
MAX_SAMPLES = 1000
