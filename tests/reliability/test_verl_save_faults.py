"""Faults in veRL's real checkpoint saves (issue 15, item 2), seeded: a trainer SIGKILLed mid-save, a saved
checkpoint damaged, a disk that fills up during a save. Nothing may lose a complete checkpoint, and a half-written
one is never chosen — neither by longhaul (`longhaul.checkpoints`: listing, merge, evaluation, `prepare_resume`)
nor by veRL's own resume (`find_latest_ckpt_path`: the step its tracker file names).

One process (`verl`, about a minute) wraps the tiny policy with veRL's FSDP2 and saves with veRL's own code
(`PPOTrainer._save_checkpoint` → `FSDPCheckpointManager`, then `data.pt`, then the tracker). A forked trainer saves
step after step and is SIGKILLed at a seeded random moment (`KILLS` trials); after each kill longhaul's repair runs,
veRL's choice is read, and veRL loads the chosen checkpoint. A real save fills a small tmpfs (disk full). Then
`TRUNCATIONS` seeded damages of a real saved checkpoint (files cut at a random byte or removed; the tracker pointing
at it, at the step before, or cut short itself). No Ray and no vLLM: it runs beside the pipeline lane
(tests/conftest.py); the same faults in the whole pipeline are tests/reliability/test_launcher_faults.py.

Figures go to the reliability report (area "launcher"); lost = checkpoints lost or a half-written one chosen.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from longhaul.checkpoints import FSDP_CONFIG_FILE, TRACKER_FILE, prepare_resume, saved_steps, step_dir
from support.checkpoint_faults import digest, small_filesystem, tiny_policy, verl_choice

KILLS = 20
TRUNCATIONS = 20
SEED = 15


def _cpu_env() -> dict[str, str]:
    from longhaul.verlcpu import cpu_job_env

    return {**os.environ, **cpu_job_env()}


#: One process: the tiny policy under veRL's FSDP2 (one rank, gloo), saved by veRL's own trainer code. argv: out
#: dir, model dir, seed, kill trials, tmpfs dir for the disk-full save (or "-"). Prints one JSON line per event.
HARNESS = r'''
import hashlib, json, os, random, signal, sys, time
from pathlib import Path
from types import SimpleNamespace

import torch

torch.set_num_threads(1)  # no OpenMP pool in the parent: the trials fork
import torch.distributed as dist

out, base, seed, trials, fill_dir = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", init_method=f"file://{out}/.pg-{os.getpid()}", rank=0, world_size=1)
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.fsdp_utils import apply_fsdp2, fsdp2_load_full_state_dict

from longhaul.checkpoints import CheckpointError, prepare_resume, saved_steps, step_dir

tok = AutoTokenizer.from_pretrained(base)
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
full = model.state_dict()
apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32),
                    "offload_policy": None, "reshard_after_forward": True}, OmegaConf.create({}))
fsdp2_load_full_state_dict(model, full, mesh, None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
contents = OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                             "load_contents": ["model", "optimizer", "extra"]})
mgr = FSDPCheckpointManager(model, opt, None, processing_class=tok, checkpoint_config=contents)
ids = torch.tensor([tok("a reservation for the airline agent")["input_ids"]])


class ActorGroup:  # the trainer's actor worker group: veRL's FSDP engine saves with FSDPCheckpointManager
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        mgr.save_checkpoint(local_path=local_path, hdfs_path=hdfs_path, global_step=global_step,
                            max_ckpt_to_keep=max_ckpt_to_keep)


def trainer_for(ckpt):
    t = SimpleNamespace(
        config=OmegaConf.create({"trainer": {"default_local_dir": str(ckpt), "default_hdfs_dir": None},
                                 "actor_rollout_ref": {"actor": {"checkpoint": {"async_save": False}}}}),
        global_steps=0, actor_rollout_wg=ActorGroup(), use_critic=False, trainer_mode="sync",
        checkpoint_callback=SimpleNamespace(on_save=lambda **kw: None))
    t.train_dataloader = SimpleNamespace(state_dict=lambda: {"step": t.global_steps})
    return t


def train_and_save(trainer, step):
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    trainer.global_steps = step
    PPOTrainer._save_checkpoint(trainer)  # veRL's own: actor shards, data.pt, then the tracker


def digest(d):
    return {str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.rglob("*"))
            if f.is_file()}


def check(ckpt):
    """What a restart does: longhaul's repair, then veRL's own choice, then veRL's load of it."""
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    rec = {"tracker_at_kill": tracker.read_text() if tracker.is_file() else None,
           "dirs_at_kill": sorted(p.name for p in ckpt.glob("global_step_*"))}
    try:
        point = prepare_resume(ckpt)
    except CheckpointError as exc:
        return {**rec, "error": str(exc)}
    rec.update(chosen=point.step, changes=list(point.changes), saved=saved_steps(ckpt))
    found = find_latest_ckpt_path(str(ckpt))
    rec["verl_choice"] = found and Path(found).name
    if point.step is not None:
        try:
            mgr.load_checkpoint(str(step_dir(ckpt, point.step) / "actor"))
            torch.load(step_dir(ckpt, point.step) / "data.pt", weights_only=False)
            rec["loaded"] = True
        except Exception as exc:  # noqa: BLE001
            rec["loaded"] = f"{type(exc).__name__}: {exc}"
    return rec


rng = random.Random(seed)
print(json.dumps({"event": "ready"}), flush=True)
for trial in range(trials):
    ckpt = out / f"kill{trial}" / "checkpoints"
    ckpt.mkdir(parents=True)
    pid = os.fork()
    if pid == 0:  # the trainer: one step and its save after another, until killed
        # a forked child cannot use the parent's gloo group; with one rank a barrier has nothing to wait for
        torch.distributed.barrier = lambda *a, **k: None
        try:
            t = trainer_for(ckpt)
            for step in range(1, 1000):
                train_and_save(t, step)
        finally:
            os._exit(0)
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + 60
    while not tracker.is_file() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.6))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print(json.dumps({"event": "kill", "trial": trial, **check(ckpt)}), flush=True)

pristine = out / "pristine" / "checkpoints"
t = trainer_for(pristine)
for step in (1, 2):
    train_and_save(t, step)
print(json.dumps({"event": "pristine", "dir": str(pristine)}), flush=True)

if fill_dir != "-":  # a checkpoint filesystem with room for one checkpoint: the second save fails
    ckpt = Path(fill_dir)
    t = trainer_for(ckpt)
    train_and_save(t, 1)
    before = digest(step_dir(ckpt, 1))
    try:
        train_and_save(t, 2)
        err = None
    except Exception as exc:  # noqa: BLE001 - torch's zip writer reports a short write as RuntimeError
        err = f"{type(exc).__name__}: {exc}"
    rec = check(ckpt)
    print(json.dumps({"event": "fill", "error": err, "step1_intact": digest(step_dir(ckpt, 1)) == before,
                      **rec}), flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def verl_saves(tmp_path_factory) -> SimpleNamespace:
    """Run HARNESS once: KILLS kill trials, a pristine two-step checkpoint, a save into a full tmpfs."""
    pytest.importorskip("verl")
    policy = tiny_policy()
    out = tmp_path_factory.mktemp("verl_saves")
    # One checkpoint of the tiny policy: model + two Adam moments (float32) + tokenizer/config; room for 1.5.
    one = 3 * (policy / "model.safetensors").stat().st_size + 2**20
    t0 = time.monotonic()
    with small_filesystem(out / "full" / "checkpoints", int(one * 1.5)) as mounted:
        res = subprocess.run(
            [
                sys.executable,
                "-c",
                HARNESS,
                str(out),
                str(policy),
                str(SEED),
                str(KILLS),
                str(out / "full" / "checkpoints") if mounted else "-",
            ],
            env=_cpu_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    took = time.monotonic() - t0
    (out / "harness.log").write_text(res.stdout + res.stderr)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    events = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    return SimpleNamespace(
        kills=[e for e in events if e["event"] == "kill"],
        fill=next((e for e in events if e["event"] == "fill"), None),
        pristine=Path(next(e["dir"] for e in events if e["event"] == "pristine")),
        mounted=mounted,
        took=took,
    )


def _landed_mid_write(rec: dict) -> bool:
    """The kill cut a save: a step directory newer than the tracker was on disk.

    A tracker that is not a number was being rewritten by veRL, which records a step only after all its files are
    written: that kill landed after the save, not inside it (nothing to clear; the test above expects that step).
    """
    tracker = rec["tracker_at_kill"]
    if tracker is not None and not tracker.isdigit():
        return False
    newest = max((int(d.rsplit("_", 1)[1]) for d in rec["dirs_at_kill"]), default=0)
    return newest > (int(tracker) if tracker and tracker.isdigit() else 0)


@pytest.mark.verl
def test_sigkill_of_real_verl_saves_never_chooses_a_half_written_checkpoint(verl_saves, reliability):
    """SIGKILL at a seeded random moment of a trainer that saves step after step with veRL's own code: the
    restart resumes from the newest complete step (the tracker's), never from the cut one, and veRL loads it."""
    bad = []
    for rec in verl_saves.kills:
        tracker = rec["tracker_at_kill"]
        if tracker is None:
            newest_complete = None
        elif tracker.isdigit():
            newest_complete = int(tracker)
        else:  # killed while veRL rewrote the tracker: the step it was recording has all its files
            newest_complete = max(int(d.rsplit("_", 1)[1]) for d in rec["dirs_at_kill"])
        ok = (
            "error" not in rec
            and rec["chosen"] == newest_complete
            and rec["verl_choice"] == (f"global_step_{newest_complete}" if newest_complete else None)
            and rec.get("loaded", True) is True
            and rec["saved"][-1:] == ([newest_complete] if newest_complete else [])
        )
        if not ok:
            bad.append(rec)
    mid = [r for r in verl_saves.kills if _landed_mid_write(r)]
    between = [r for r in verl_saves.kills if not _landed_mid_write(r)]
    for fault, recs in (("SIGKILL mid-checkpoint", mid), ("SIGKILL between saves", between)):
        reliability(
            "launcher",
            f"{fault} (veRL save, seeded)",
            injected=len(recs),
            survived=len([r for r in recs if r not in bad]),
            lost=len([r for r in recs if r in bad]),
            lost_what="checkpoints",
        )
    assert len(verl_saves.kills) == KILLS
    assert not bad, json.dumps(bad, indent=1)[:4000]
    assert len(mid) >= 3, "too few kills landed inside a save to test it"
    # The interrupted save was cleared out of veRL's way: removed when its files were not whole, set aside
    # (`.incomplete`) when the kill fell after its last file but before veRL recorded it in the tracker.
    cleared = ("a save cut short", "whole but never recorded in the tracker")
    for rec in mid:
        assert any(why in c for c in rec["changes"] for why in cleared), rec
    assert any("a save cut short" in c for rec in mid for c in rec["changes"]), "no kill cut a save's files"


@pytest.mark.verl
def test_truncated_checkpoints_are_never_chosen(verl_saves, reliability, tmp_path):
    """TRUNCATIONS seeded damages of step 2 of a real two-step checkpoint: a kill cut of veRL's write sequence (a
    file a resume or merge reads cut at a random byte, every file written after it missing), or one such file
    removed or cut; the
    tracker naming step 2, step 1, or itself cut short. Step 1 is chosen every time, by longhaul and then by
    veRL, and is left byte for byte as it was."""
    rng = random.Random(SEED)
    pristine = verl_saves.pristine
    step1 = digest(step_dir(pristine, 1))
    assert saved_steps(pristine) == [1, 2]
    order = sorted((f for f in step_dir(pristine, 2).rglob("*") if f.is_file()), key=lambda f: f.stat().st_mtime_ns)
    required = [f for f in order if f.name.endswith(".pt") or f.name in (FSDP_CONFIG_FILE, "config.json")]
    trials, bad = [], []
    for i in range(TRUNCATIONS):
        root = tmp_path / f"t{i}" / "checkpoints"
        shutil.copytree(pristine, root)
        kind = rng.choice(["cut", "remove", "truncate"])
        src = rng.choice(required)
        f = root / src.relative_to(pristine)
        if kind == "remove":
            f.unlink()
        else:  # cut inside the content (a JSON file's trailing newline is not content)
            data = f.read_bytes()
            f.write_bytes(data[: rng.randrange(len(data.rstrip(b"\n")))])
            if kind == "cut":  # every file veRL writes after it is missing
                for later in order:
                    if later.stat().st_mtime_ns > src.stat().st_mtime_ns:
                        (root / later.relative_to(pristine)).unlink()
        tracker = rng.choice(["2", "1", ""])
        (root / TRACKER_FILE).write_text(tracker)
        point = prepare_resume(root)
        rec = {
            "trial": i,
            "damage": kind,
            "file": str(src.relative_to(pristine)),
            "tracker": tracker,
            "chosen": point.step,
            "saved": saved_steps(root),
            "verl": verl_choice(root),
            "step1_intact": digest(step_dir(root, 1)) == step1,
            "step2_left": step_dir(root, 2).exists(),
        }
        trials.append(rec)
        if (rec["chosen"], rec["saved"], rec["verl"], rec["step1_intact"], rec["step2_left"]) != (
            1,
            [1],
            "global_step_1",
            True,
            False,
        ):
            bad.append(rec)
    reliability(
        "launcher",
        "truncated checkpoint (veRL save, seeded)",
        injected=len(trials),
        survived=len(trials) - len(bad),
        lost=len(bad),
        lost_what="checkpoints",
    )
    assert not bad, json.dumps(bad, indent=1)
    assert {t["damage"] for t in trials} == {"cut", "remove", "truncate"} and {t["tracker"] for t in trials} == {
        "2",
        "1",
        "",
    }


@pytest.mark.verl
def test_disk_full_during_a_real_verl_save_keeps_the_previous_checkpoint(verl_saves, reliability):
    if not verl_saves.mounted:
        pytest.skip("mounting a tmpfs is not permitted here (needs root / CAP_SYS_ADMIN)")
    rec = verl_saves.fill
    ok = (
        rec["error"] is not None
        and rec["step1_intact"]
        and rec.get("chosen") == 1
        and rec.get("verl_choice") == "global_step_1"
        and rec.get("loaded") is True
    )
    reliability(
        "launcher",
        "disk full during save (veRL save)",
        injected=1,
        survived=int(ok),
        lost=int(not ok),
        lost_what="checkpoints",
    )
    assert ok, rec
    # torch's zip writer reports the short write without the errno ("unexpected pos"); the launcher recognises a
    # full disk by the free space left (test_launcher_faults.py's disk-full test, and tests/unit/launcher)
    assert "unexpected pos" in rec["error"] or "No space left" in rec["error"], rec["error"]
