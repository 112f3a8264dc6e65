"""Training-step metrics logged exactly as the trainer logs them: veRL's own `verl.utils.tracking.Tracking` with
the `mlflow` backend, attached through MLFLOW_TRACKING_URI / MLFLOW_RUN_ID from the environment (what the launcher
hands to `verl.trainer.main_ppo`).

    python tests/support/verl_metrics_trainer.py --first 1 --steps 40 --keys 12 --interval 0.1

Prints `ready` once the logger is attached, then one JSON line per step: `{"step", "start", "took"}` (wall-clock
start, seconds the `log` call took). Step s logs `k<i>` = s + i/1000 for i < keys (`expected_value`).
"""

from __future__ import annotations

import argparse
import json
import time


def expected_value(step: int, i: int) -> float:
    return step + i / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--first", type=int, default=1)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.1)
    args = ap.parse_args()

    from verl.utils.tracking import Tracking

    tracker = Tracking(
        project_name="longhaul-reliability",
        experiment_name="trainer",
        default_backend=["mlflow"],
        config={"trainer": {"total_training_steps": args.first + args.steps - 1}},
    )
    print("ready", flush=True)
    for step in range(args.first, args.first + args.steps):
        start = time.time()
        tracker.log({f"k{i}": expected_value(step, i) for i in range(args.keys)}, step=step)
        print(json.dumps({"step": step, "start": start, "took": time.time() - start}), flush=True)
        time.sleep(args.interval)
    tracker.finish()


if __name__ == "__main__":
    main()
