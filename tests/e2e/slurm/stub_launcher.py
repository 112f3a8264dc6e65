"""A stand-in for `longhaul launch` that speaks the launcher's signal protocol and nothing else.

It exercises the batch script's mechanics (USR1 trap → checkpoint → exit 75 → `scontrol requeue` → resume)
on the real Slurm without the training stack. Progress is a counter "trained" one step per 0.5 s and
checkpointed after every step, so a requeue must resume from the newest checkpoint to be seen as continuous.

Files in --run-dir: `stub.ckpt` (last checkpointed step), `stub-events.jsonl` (one line per start, checkpoint
and exit, with SLURM_RESTART_COUNT; a start also records the seed of the mounted spec and the job variables).
Env STUB_STEPS_AFTER_RESTART: steps a restarted run trains before it finishes (default 4); a first run trains
until it is signalled, or STUB_FIRST_RUN_STEPS steps when that is set.

veRL checkpoint mode (env STUB_CKPT_SHARDS=W set; tests/reliability/test_slurm_faults.py): checkpoints are saved
the way veRL saves them, slowly and deterministically, into `<run dir>/checkpoints` (`longhaul.checkpoints`
layout): `global_step_N/actor/` with `fsdp_config.json`, `huggingface/config.json` and, per rank, the model
shard written in STUB_SHARD_CHUNKS (4) chunks STUB_SHARD_WRITE_S (1.0) seconds apart, then the optimizer and
extra-state shards (everything `longhaul.checkpoints.step_complete` requires), and then veRL's tracker file
`latest_checkpointed_iteration.txt`, last, written in place as veRL does. A start resumes from
`longhaul.checkpoints.latest_step` (the production choice of "newest complete checkpoint") and then loads it:
every shard must hold exactly the bytes that step wrote (a cut-short shard is still a non-empty file, so the
tracker is what keeps it out). SIGTERM (scancel, `scontrol requeue`, preemption) and SIGUSR1 stop the process at
once, wherever it is, like veRL's trainer stopped by the launcher: no save on the way out; SIGUSR1 exits 75 (the
resume point is the newest periodic checkpoint), SIGTERM 143. Events: `ckpt_begin`/`ckpt_end` around every save
(with the time), and the start event carries `resume`, `tracker`, `step_dirs`, `loaded_ok`, `load_error`.
Training a step takes STUB_STEP_S (0.5) seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

EXIT_REQUEUE = 75
EXIT_KILLED = 143


def _archive(name: str, payload: bytes) -> bytes:
    """A zip archive holding `payload`, deterministic, like the files torch.save writes (zip format)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(zipfile.ZipInfo(f"archive/{name}", date_time=(2026, 1, 1, 0, 0, 0)), payload)
    return buf.getvalue()


def _shard_bytes(step: int, rank: int, chunks: int, kind: str = "model") -> list[bytes]:
    """The chunks of one shard file of `step`: what a whole shard holds, in the order it is written."""
    data = _archive("data.pkl", f"{kind} step={step} rank={rank} ".encode() + b"x" * 16384)
    size = -(-len(data) // chunks)
    return [data[i * size : (i + 1) * size] for i in range(chunks)]


def _verl_mode(run_dir: Path, restart: int, event: Callable[..., None], first: str | None) -> int:
    """veRL checkpoint mode (module docstring)."""
    from longhaul.checkpoints import (
        ACTOR_SUBDIR,
        FSDP_CONFIG_FILE,
        HF_SUBDIR,
        SHARD_KINDS,
        STEP_PREFIX,
        TRACKER_FILE,
        latest_step,
        shard_dir,
        step_dir,
        tracker_step,
    )

    shards = int(os.environ["STUB_CKPT_SHARDS"])
    chunks = int(os.environ.get("STUB_SHARD_CHUNKS", "4"))
    chunk_s = float(os.environ.get("STUB_SHARD_WRITE_S", "1.0")) / chunks
    step_s = float(os.environ.get("STUB_STEP_S", "0.5"))
    ckpt_dir = run_dir / "checkpoints"
    state = {"step": 0, "writing": None}

    def stop(code: int, why: str) -> None:
        try:
            point: object = latest_step(ckpt_dir) or 0
        except ValueError as exc:  # the tracker caught between veRL's truncate and write
            point = str(exc)
        event(
            "exit", code=code, step=state["step"], writing=state["writing"], why=why, resume_point=point, t=time.time()
        )
        os._exit(code)  # at once, mid-write included: nothing is saved on the way out

    def load(step: int) -> str | None:
        """None when `step`'s shards hold exactly what a whole save of `step` wrote, else what is wrong."""
        for rank in range(shards):
            for kind in SHARD_KINDS:
                f = shard_dir(ckpt_dir, step) / f"{kind}_world_size_{shards}_rank_{rank}.pt"
                if not f.is_file() or f.read_bytes() != b"".join(_shard_bytes(step, rank, chunks, kind)):
                    return f"{f.name} of step {step} is not whole"
        return None

    def save(step: int) -> None:
        state["writing"] = step
        event("ckpt_begin", step=step, t=time.time())
        actor = shard_dir(ckpt_dir, step)
        (actor / HF_SUBDIR).mkdir(parents=True, exist_ok=True)
        (actor / FSDP_CONFIG_FILE).write_text(json.dumps({"FSDP_version": 2, "world_size": shards}))
        (actor / HF_SUBDIR / "config.json").write_text("{}")
        for rank in range(shards):
            with (actor / f"model_world_size_{shards}_rank_{rank}.pt").open("wb") as fh:
                for chunk in _shard_bytes(step, rank, chunks):
                    fh.write(chunk)
                    fh.flush()
                    time.sleep(chunk_s)
            for kind in SHARD_KINDS[1:]:  # optimizer and extra state: written after the model shard, quickly
                (actor / f"{kind}_world_size_{shards}_rank_{rank}.pt").write_bytes(
                    b"".join(_shard_bytes(step, rank, chunks, kind))
                )
        (step_dir(ckpt_dir, step) / "data.pt").write_bytes(_archive("data.pkl", f"dataloader step={step}".encode()))
        with (ckpt_dir / TRACKER_FILE).open("w") as fh:  # veRL writes the tracker in place, after the step
            fh.write(str(step))
        state["writing"] = None
        event("ckpt_end", step=step, t=time.time())

    signal.signal(signal.SIGUSR1, lambda *_: stop(EXIT_REQUEUE, "SIGUSR1"))
    signal.signal(signal.SIGTERM, lambda *_: stop(EXIT_KILLED, "SIGTERM"))
    tracker = tracker_step(ckpt_dir) if ckpt_dir.is_dir() else None
    resume = latest_step(ckpt_dir) if ckpt_dir.is_dir() else None
    step_dirs = (
        sorted(int(d.name[len(STEP_PREFIX) :]) for d in ckpt_dir.glob(f"{STEP_PREFIX}*") if (d / ACTOR_SUBDIR).is_dir())
        if ckpt_dir.is_dir()
        else []
    )
    load_error = load(resume) if resume is not None else None
    state["step"] = resume or 0
    event(
        "start",
        step=state["step"],
        resume=resume,
        tracker=tracker,
        step_dirs=step_dirs,
        loaded_ok=load_error is None,
        load_error=load_error,
        run_name=os.environ.get("LONGHAUL_RUN_NAME"),
    )
    target = (
        state["step"] + int(os.environ.get("STUB_STEPS_AFTER_RESTART", "4"))
        if restart
        else int(first)
        if first
        else None
    )
    while target is None or state["step"] < target:
        time.sleep(step_s)
        state["step"] += 1
        save(state["step"])
    event("exit", code=0, step=state["step"])
    return 0


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
            fh.write(
                json.dumps({"event": kind, "restart": restart, "job": os.environ.get("SLURM_JOB_ID"), **kw}) + "\n"
            )

    def save(step: int) -> None:
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(str(step), encoding="utf-8")
        tmp.replace(ckpt)

    if os.environ.get("STUB_CKPT_SHARDS"):
        return _verl_mode(run_dir, restart, event, os.environ.get("STUB_FIRST_RUN_STEPS"))
    step = int(ckpt.read_text()) if ckpt.is_file() else 0
    spec = Path(args.spec)
    seed = None
    if spec.is_file():
        import yaml

        seed = ((yaml.safe_load(spec.read_text(encoding="utf-8")).get("spec") or {}).get("algorithm") or {}).get("seed")
    event(
        "start",
        step=step,
        argv=sys.argv[1:],
        spec_exists=spec.is_file(),
        seed=seed,
        offline=os.environ.get("HF_HUB_OFFLINE"),
        run_name=os.environ.get("LONGHAUL_RUN_NAME"),
        job_id=os.environ.get("LONGHAUL_JOB_ID"),
        array_task=os.environ.get("SLURM_ARRAY_TASK_ID"),
    )
    flags = {"usr1": False, "term": False}
    signal.signal(signal.SIGUSR1, lambda *_: flags.__setitem__("usr1", True))
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("term", True))
    first = os.environ.get("STUB_FIRST_RUN_STEPS")
    target = step + int(os.environ.get("STUB_STEPS_AFTER_RESTART", "4")) if restart else int(first) if first else None
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
