"""Advantage estimators at batch 256 × 12,288 tokens against veRL's own `grpo`, side by side in one run.

Multi-turn masks (assistant runs separated by tool/user gaps, right padding), 32 groups of 8, in the agent loop's
turn-credit layout (`longhaul.rewards.combine`): a per-turn process share on the first token of every assistant
turn and the binary outcome on the last response position. The trajectory-credit rows read the same batch (only
its row sums matter to them); the turn-credit rows decode the shares and compute per-turn baselines. Prints the
median time of each and its ratio to veRL's `compute_grpo_outcome_advantage`. Target: every longhaul estimator
within 2×.

    python benchmarks/bench_estimators.py [--bs 256] [--T 12288] [--repeat 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def make_batch(bs: int, T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(bs, T, dtype=torch.long)
    rewards = torch.zeros(bs, T)
    for i in range(bs):
        L = int(torch.randint(T // 4, T + 1, (1,), generator=g))
        t = 0
        starts = []
        last = 0
        while t < L:
            run = int(torch.randint(20, 400, (1,), generator=g))
            mask[i, t : min(t + run, L)] = 1
            starts.append(t)
            last = min(t + run, L) - 1
            t += run + int(torch.randint(50, 600, (1,), generator=g))
        for s in starts:
            rewards[i, s] = float(torch.randn(1, generator=g)) * 0.01
        rewards[i, last] += float(torch.randint(0, 2, (1,), generator=g))
    index = np.array([f"task{i // 8}" for i in range(bs)], dtype=object)
    return rewards, mask, index


def timed(fn, repeat: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, default=256)
    ap.add_argument("--T", type=int, default=12288)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (default 1: on an oversubscribed machine multi-threaded "
        "small ops measure scheduler contention, not the estimators; 0 = torch default)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import verl  # noqa: F401  (registers the longhaul estimators through the entry point)
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    r, m, index = make_batch(args.bs, args.T)
    base = timed(lambda: core_algos.compute_grpo_outcome_advantage(r, m, index), args.repeat)
    print(
        f"estimators at batch {args.bs} x {args.T} tokens, torch threads {torch.get_num_threads()}, median of {args.repeat}"  # noqa: E501 - a string literal kept whole
    )
    print(f"  {'veRL grpo':48s} {base * 1e3:8.1f} ms   x1.00")
    worst = 0.0
    for name in ("longhaul_grpo", "longhaul_turn_discount", "longhaul_lata", "longhaul_lata_turn_discount"):
        fn = core_algos.get_adv_estimator_fn(name)
        for label, lh in (
            ("turn unit, trajectory credit", {"discount_unit": "turn", "credit": "trajectory", "seed_compat": False}),
            ("token unit, turn credit", {"discount_unit": "token", "credit": "turn", "seed_compat": False}),
            ("seed_compat", {"discount_unit": "token", "credit": "trajectory", "seed_compat": True}),
        ):
            if name == "longhaul_grpo" and label == "seed_compat":
                continue
            cfg = OmegaConf.create(
                {
                    "norm_adv_by_std_in_grpo": True,
                    "longhaul": {"alpha": 1.05, "length_exponent": 0.5, "process_weight": 0.3, **lh},
                }
            )
            t = timed(
                lambda fn=fn, cfg=cfg: fn(token_level_rewards=r, response_mask=m, index=index, config=cfg), args.repeat
            )
            worst = max(worst, t / base)
            print(f"  {name + ' (' + label + ')':48s} {t * 1e3:8.1f} ms   x{t / base:.2f}")
    print(
        f"  target: every estimator within 2x of veRL grpo: {'met' if worst <= 2.0 else 'NOT met'} (worst x{worst:.2f})"
    )


if __name__ == "__main__":
    main()
