"""Realistic ablation runs written through longhaul's MLflow adapter (for e2e tests and UI checks).

Training metrics go through veRL's own MLflow logger (`verl.utils.tracking.Tracking`) attached with
MLFLOW_TRACKING_URI / MLFLOW_RUN_ID exactly as the launcher hands them over; checkpoints and evaluation
children go through `longhaul.tracking.runs`. Outcomes are drawn from a seeded RNG and the evaluation
summaries are computed from those per-task outcomes, so tests can recompute every number they read back.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from longhaul.eval.metrics import TrialRecord, compute_summary
from longhaul.spec import Experiment, load_spec, run_name
from longhaul.tracking.config import tracking_env
from longhaul.tracking.runs import TrackedRun, log_checkpoint, log_evaluation, start_or_resume_run

REPO = Path(__file__).resolve().parents[2]
#: spec file → (success probability at the first and the last checkpoint, response-length curve kind)
ABLATION = {
    "vanilla.yaml": (0.20, 0.15, "collapse"),
    "lata.yaml": (0.15, 0.35, "steady"),
    "prm_lite_lata.yaml": (0.20, 0.45, "steady"),
}
STEPS = 30
CHECKPOINTS = (10, 20, 30)
TASKS = {"train": list(range(0, 12)), "test": list(range(12, 16))}
TRIALS = 4
KS = (1, 2, 4)


@dataclass
class PopulatedRun:
    spec_file: str
    exp: Experiment
    tracked: TrackedRun
    run_dir: Path
    summaries: dict[int, dict] = field(default_factory=dict)
    eval_run_ids: dict[int, str] = field(default_factory=dict)
    jsonl: dict[int, Path] = field(default_factory=dict)
    training: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def build_summary(outcomes: list[dict], seed: int) -> dict:
    """The evaluation summary exactly as `longhaul eval` computes it (`compute_summary`), from trial records."""
    records = [TrialRecord.from_dict(o) for o in outcomes]
    return compute_summary(records, KS, rng=random.Random(seed), bootstrap_samples=200)


def _outcomes(rng: random.Random, p: float) -> list[dict]:
    """Per-trial records in the eval JSONL shape; task difficulty varies so pass^k < pass^1 < pass@k."""
    out = []
    for subset, tasks in TASKS.items():
        for t in tasks:
            ease = (t % 4) / 3.0
            for trial in range(TRIALS):
                ok = rng.random() < min(0.95, p * (0.5 + ease))
                aborted = not ok and rng.random() < 0.2
                calls = rng.randint(2, 8)
                out.append(
                    {
                        "task_id": str(t),
                        "trial": trial,
                        "success": ok,
                        "subset": subset,
                        "subsets": [subset, "covered_seen" if t % 2 else "uncovered_seen"]
                        if subset == "train"
                        else [subset, "unseen"],
                        "aborted": aborted,
                        "termination": "max_turns" if aborted else "user_stop",
                        "num_tool_calls": calls,
                        "num_tool_errors": int(rng.random() < 0.1),
                        "num_turns": rng.randint(3, 12),
                    }
                )
    return out


def _training_curves(rng: random.Random, kind: str) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    for step in range(1, STEPS + 1):
        if kind == "collapse":  # rises, then falls to a third of its peak (the vanilla pattern)
            length = 900 + 100 * step if step <= 10 else max(300.0, 1900 - 130 * (step - 10))
        else:
            length = 1500 + 15 * step + rng.uniform(-40, 40)
        score = min(1.0, 0.1 + 0.02 * step + rng.uniform(-0.03, 0.03))
        metrics = {
            "response_length/mean": length,
            "critic/score/mean": score,
            "critic/advantages/max": 1.2 + rng.uniform(0, 0.3),
            "critic/advantages/min": -1.1 - rng.uniform(0, 0.3),
            "actor/pg_loss": rng.uniform(-0.05, 0.05),
        }
        if step % 10 == 0:
            metrics["val-core/tau2_airline/reward/mean@1"] = score
        for k, v in metrics.items():
            curves.setdefault(k, []).append((step, v))
    return curves


def populate_ablation_runs(tracking_uri: str, root: Path, *, job_id: str = "job-1") -> list[PopulatedRun]:
    """Create one training run per ablation spec with metrics, checkpoints and three evaluated checkpoints."""
    from verl.utils.tracking import Tracking

    runs = []
    for i, (spec_file, (p0, p1, kind)) in enumerate(ABLATION.items()):
        exp = load_spec(REPO / "specs" / spec_file)
        run_dir = root / run_name(exp)
        environ = {
            "LONGHAUL_JOB_ID": job_id,
            "LONGHAUL_IMAGE": "ghcr.io/longhaul-dev/trainer:0.1.0",
            "LONGHAUL_GIT_COMMIT": "0123456789abcdef0123456789abcdef01234567",
        }
        tracked = start_or_resume_run(exp, tracking_uri, run_dir, "kubernetes", environ=environ)
        env = tracking_env(
            exp, run_dir, "kubernetes", run_id=tracked.run_id, environ={"MLFLOW_TRACKING_URI": tracking_uri}
        )
        rng = random.Random(1000 + i)
        curves = _training_curves(rng, kind)
        pop = PopulatedRun(spec_file, exp, tracked, run_dir, training=curves)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            tracker = Tracking(
                project_name=env["MLFLOW_EXPERIMENT_NAME"],
                experiment_name=run_name(exp),
                default_backend=["mlflow"],
                config={
                    "algorithm": {"adv_estimator": str(exp.spec.algorithm.advantage)},
                    "trainer": {"total_training_steps": STEPS},
                },
            )
            for step in range(1, STEPS + 1):
                tracker.log({k: dict(v)[step] for k, v in curves.items() if step in dict(v)}, step=step)
                if step in CHECKPOINTS:
                    log_checkpoint(
                        tracking_uri, tracked.run_id, step, f"s3://checkpoints/{run_name(exp)}/global_step_{step}"
                    )
            tracker.finish()
        for j, step in enumerate(CHECKPOINTS):
            p = p0 + (p1 - p0) * j / (len(CHECKPOINTS) - 1)
            outcomes = _outcomes(random.Random(100 * i + step), p)
            jsonl = run_dir / f"eval_step{step}.jsonl"
            jsonl.write_text("".join(json.dumps(o) + "\n" for o in outcomes), encoding="utf-8")
            summary = build_summary(outcomes, seed=step)
            pop.summaries[step] = summary
            pop.jsonl[step] = jsonl
            pop.eval_run_ids[step] = log_evaluation(tracked.run_id, step, summary, jsonl, tracking_uri=tracking_uri)
        runs.append(pop)
    return runs


#: A two-arm study with training seeds: arm name → success probability; per-task and per-seed shifts on top.
STUDY_ARMS = {"study-a": 0.25, "study-b": 0.65}
STUDY_SEEDS = (1, 2, 3)


@dataclass
class StudyArm:
    group: Experiment
    seed_runs: dict[int, TrackedRun] = field(default_factory=dict)
    records: dict[int, list[dict]] = field(default_factory=dict)  # seed → trial records


def populate_seed_study(tracking_uri: str, root: Path, *, step: int = 5) -> dict[str, StudyArm]:
    """Two multi-seed Experiments (smoke with `seeds`), each seed run evaluated once at `step` on the 16 tasks of
    TASKS with TRIALS samples; outcomes drawn from a seeded generator with task and seed effects."""
    import yaml

    from longhaul.spec import parse_spec_text, seed_runs

    base = yaml.safe_load((REPO / "specs" / "smoke.yaml").read_text(encoding="utf-8"))
    base["spec"]["algorithm"].pop("seed")
    base["spec"]["algorithm"]["seeds"] = list(STUDY_SEEDS)
    rng = random.Random(2024)
    task_shift = {t: rng.uniform(-0.15, 0.15) for ts in TASKS.values() for t in ts}
    arms = {}
    for name, p in STUDY_ARMS.items():
        base["metadata"]["name"] = name
        group = parse_spec_text(yaml.safe_dump(base), file=f"{name}.yaml")
        arm = StudyArm(group)
        for r in seed_runs(group):
            seed = r.spec.algorithm.seed
            tracked = start_or_resume_run(
                r, tracking_uri, root / run_name(r), "kubernetes", environ={"LONGHAUL_JOB_ID": f"{name}-{seed}"}
            )
            seed_shift = rng.uniform(-0.05, 0.05)
            out = []
            for subset, tasks in TASKS.items():
                for t in tasks:
                    q = min(0.95, max(0.05, p + task_shift[t] + seed_shift))
                    out += [
                        {
                            "task_id": str(t),
                            "trial": i,
                            "success": rng.random() < q,
                            "subset": subset,
                            "subsets": [subset],
                            "num_turns": 3,
                        }
                        for i in range(TRIALS)
                    ]
            jsonl = root / f"{run_name(r)}.results.jsonl"
            jsonl.write_text("".join(json.dumps(o) + "\n" for o in out), encoding="utf-8")
            log_evaluation(tracked.run_id, step, build_summary(out, seed=seed), jsonl, tracking_uri=tracking_uri)
            arm.seed_runs[seed], arm.records[seed] = tracked, out
        arms[name] = arm
    return arms
