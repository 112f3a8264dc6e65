"""A stand-in for `longhaul launch` that speaks the launcher's signal protocol and nothing else.

It exercises the batch script's mechanics (USR1 trap → checkpoint → exit 75 → `scontrol requeue` → resume)
on the real Slurm without the training stack. Progress is a counter "trained" one step per 0.5 s and
checkpointed after every step, so a requeue must resume from the newest checkpoint to be seen as continuous.

Files in --run-dir: `stub.ckpt` (last checkpointed step), `stub-events.jsonl` (one line per start, checkpoint
and exit, with SLURM_RESTART_COUNT; a start also records the seed of the mounted spec and the job variables).
Env STUB_STEPS_AFTER_RESTART: steps a restarted run trains before it finishes (default 4); a first run trains
until it is signalled, or STUB_FIRST_RUN_STEPS steps when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

EXIT_REQUEUE = 75
EXIT_KILLED = 143


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("verb")
    ap.add_argument("--spec", required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--stage")
    args = ap.parse_args()
    run_dir = Path(args.run_dir)
    ckpt = run_dir / "stub.ckpt"
    events = run_dir / "stub-events.jsonl"
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

    def event(kind: str, **kw: object) -> None:
        with events.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": kind, "restart": restart, "job": os.environ.get("SLURM_JOB_ID"), **kw}) + "\n")

    def save(step: int) -> None:
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(str(step), encoding="utf-8")
        tmp.replace(ckpt)

    step = int(ckpt.read_text()) if ckpt.is_file() else 0
    spec = Path(args.spec)
    seed = None
    if spec.is_file():
        import yaml

        seed = ((yaml.safe_load(spec.read_text(encoding="utf-8")).get("spec") or {}).get("algorithm") or {}).get("seed")
    event("start", step=step, argv=sys.argv[1:], spec_exists=spec.is_file(), seed=seed,
          offline=os.environ.get("HF_HUB_OFFLINE"), run_name=os.environ.get("LONGHAUL_RUN_NAME"),
          job_id=os.environ.get("LONGHAUL_JOB_ID"), array_task=os.environ.get("SLURM_ARRAY_TASK_ID"))
    flags = {"usr1": False, "term": False}
    signal.signal(signal.SIGUSR1, lambda *_: flags.__setitem__("usr1", True))
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("term", True))
    first = os.environ.get("STUB_FIRST_RUN_STEPS")
    target = (step + int(os.environ.get("STUB_STEPS_AFTER_RESTART", "4")) if restart
              else int(first) if first else None)
    while True:
        if flags["usr1"]:
            save(step)
            event("checkpoint", step=step, why="SIGUSR1")
            event("exit", code=EXIT_REQUEUE, step=step)
            return EXIT_REQUEUE
        if flags["term"]:
            event("exit", code=EXIT_KILLED, step=step)
            return EXIT_KILLED
        if target is not None and step >= target:
            event("exit", code=0, step=step)
            return 0
        time.sleep(0.5)
        step += 1
        save(step)


if __name__ == "__main__":
    sys.exit(main())
