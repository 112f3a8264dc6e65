"""The pure Kubernetes renderer: golden files for every shipped spec, schema validity, naming and security."""

from __future__ import annotations

import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from longhaul import constants as C
from longhaul.render import kubernetes as R
from longhaul.render import render
from longhaul.spec import load_spec, parse_spec_text, run_name, seed_runs, spec_hash
from longhaul.spec.models import Experiment

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
GOLDEN = ROOT / "tests/golden/kubernetes"
UPDATE = os.environ.get("LONGHAUL_UPDATE_GOLDEN") == "1"


def _with(exp: Experiment, **spec: object) -> Experiment:
    doc = exp.model_dump(mode="json")
    for dotted, value in spec.items():
        cur = doc["spec"]
        *parents, last = dotted.split("__")
        for p in parents:
            cur = cur[p]
        cur[last] = value
    return Experiment.model_validate(doc)


def _smoke_seeds(seeds: list[int]) -> Experiment:
    """specs/smoke.yaml with `seeds` instead of `seed: 7`."""
    doc = yaml.safe_load((ROOT / "specs/smoke.yaml").read_text())
    del doc["spec"]["algorithm"]["seed"]
    doc["spec"]["algorithm"]["seeds"] = seeds
    return parse_spec_text(yaml.safe_dump(doc, sort_keys=False), file="smoke-seeds.yaml")


def _variants() -> list[tuple[str, Experiment]]:
    # Shipped specs have their golden renders in tests/golden/<spec>/kubernetes.yaml (scripts/generate.py,
    # tests/unit/test_generated.py); these pin the multi-node engines and a multi-seed Experiment, which no
    # shipped spec uses.
    base = load_spec(ROOT / "specs/prm_lite_lata.yaml")
    return [
        ("prm_lite_lata-nodes2-rayjob", _with(base, resources__nodes=2)),
        (
            "prm_lite_lata-nodes2-jobset",
            _with(base, resources__nodes=2, backends__kubernetes__multinode_engine="jobset"),
        ),
        ("smoke-seeds", _smoke_seeds([7, 8])),
        # Kueue: suspended, queue and WorkloadPriorityClass labels on the RayJob
        # (tests/unit/k8s/test_kueue_multinode.py).
        (
            "prm_lite_lata-nodes2-rayjob-kueue",
            _with(
                base,
                resources__nodes=2,
                backends__kubernetes__queue="team-a",
                backends__kubernetes__priority_class="high",
            ),
        ),
    ]


@pytest.mark.parametrize(("stem", "exp"), _variants(), ids=[v[0] for v in _variants()])
def test_golden_variants(stem: str, exp: Experiment) -> None:
    """`LONGHAUL_UPDATE_GOLDEN=1 pytest tests/unit/k8s` regenerates; review the diff."""
    text = yaml.safe_dump_all(R.render_kubernetes(exp, namespace="default"), sort_keys=False, width=1_000_000)
    path = GOLDEN / f"{stem}.yaml"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run LONGHAUL_UPDATE_GOLDEN=1 pytest tests/unit/k8s"
    assert text == path.read_text(), f"render of {stem} differs from {path}; regenerate and review the diff"


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_builtin_objects_pass_strict_kubernetes_schemas(spec: Path) -> None:
    for obj in R.render_kubernetes(load_spec(spec), namespace="ns1"):
        kubernetes_validate.validate(obj, "1.32", strict=True)


def test_objects_order_names_and_labels() -> None:
    exp = load_spec(ROOT / "specs/prm_lite_lata.yaml")
    run = run_name(exp)
    objs = R.render_kubernetes(exp)
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("ConfigMap", f"{run}-spec"),
        ("Job", f"{run}-grpo"),
        ("Job", f"{run}-eval"),
    ]
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels[C.LABEL_RUN_NAME] == run
        assert labels[C.LABEL_SPEC_HASH] == spec_hash(exp)[:8]
        assert labels[C.LABEL_EXPERIMENT] == exp.metadata.name
        assert labels["app.kubernetes.io/managed-by"] == C.MANAGED_BY
        assert "namespace" not in obj["metadata"]  # none given anywhere
        assert "ownerReferences" not in obj["metadata"]  # the operator adopts; names never depend on the owner
    assert yaml.safe_load(objs[0]["data"][C.SPEC_FILENAME])["spec"] == exp.spec.model_dump(mode="json")


def test_names_stay_within_63_characters_and_keep_the_hash() -> None:
    exp = load_spec(ROOT / "specs/prm_lite_lata.yaml")
    long = Experiment.model_validate({**exp.model_dump(mode="json"), "metadata": {"name": "a" * 54}})
    for obj in R.render_kubernetes(long):
        name = obj["metadata"]["name"]
        assert len(name) <= 63
        assert spec_hash(long)[:8] in name


def test_job_pod_security_resources_and_launcher() -> None:
    exp = load_spec(ROOT / "specs/prm_lite_lata.yaml")
    job = R.render_job(exp, "grpo")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == [
        "longhaul",
        "launch",
        "--spec",
        "/etc/longhaul/experiment.yaml",
        "--backend",
        "kubernetes",
        "--run-dir",
        f"/runs/{run_name(exp)}",
        "--stage",
        "grpo",
    ]
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    assert c["resources"]["limits"] == {"cpu": "32", "memory": "512Gi", "nvidia.com/gpu": "2"}
    assert c["resources"]["requests"] == c["resources"]["limits"]
    shm = next(v for v in pod["volumes"] if v["name"] == R.SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    env = {e["name"]: e for e in c["env"]}
    for key, value in C.OFFLINE_ENV.items():
        assert env[key]["value"] == value
    assert env[C.ENV_STAGE]["value"] == "grpo" and env[C.ENV_BACKEND]["value"] == "kubernetes"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 259200


def test_backend_settings_reach_the_pod() -> None:
    exp = _with(
        load_spec(ROOT / "specs/prm_lite_lata.yaml"),
        backends__kubernetes__service_account="trainer",
        backends__kubernetes__priority_class="high",
        backends__kubernetes__node_selector={"gpu": "a800"},
        backends__kubernetes__tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        backends__kubernetes__checkpoint_volume={"claim_name": "ckpt", "mount_path": "/ckpt"},
        backends__kubernetes__backoff_limit=2,
        resources__gpus_per_node=0,
        policy__lora__rank=0,
        tracking__uri="http://mlflow:5000",
        tracking__uri_secret=None,
        resources__time_limit="01:30:00",
    )
    job = R.render_job(exp, "eval", namespace="team-a")
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == "team-a"
    assert pod["serviceAccountName"] == "trainer" and pod["priorityClassName"] == "high"
    assert pod["nodeSelector"] == {"gpu": "a800"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    assert {"name": "runs", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    c = pod["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert c["command"][c["command"].index("--run-dir") + 1] == f"/ckpt/{run_name(exp)}"
    assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"} in c["env"]
    assert job["spec"]["backoffLimit"] == 2 and job["spec"]["activeDeadlineSeconds"] == 5400


@pytest.mark.parametrize(("limit", "seconds"), [("00:00:01", 1), ("1-00:00:00", 86400), ("100:00:00", 360000)])
def test_time_limit_seconds(limit: str, seconds: int) -> None:
    assert R.time_limit_seconds(limit) == seconds


def test_multinode_engines() -> None:
    base = load_spec(ROOT / "specs/prm_lite_lata.yaml")
    ray = R.render_stage(_with(base, resources__nodes=4), "grpo")
    assert (ray["apiVersion"], ray["kind"]) == (R.RAYJOB_API, "RayJob")
    assert ray["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert ray["spec"]["entrypoint"].startswith("longhaul launch --spec /etc/longhaul/experiment.yaml")
    js = R.render_stage(_with(base, resources__nodes=4, backends__kubernetes__multinode_engine="jobset"), "grpo")
    assert (js["apiVersion"], js["kind"]) == (R.JOBSET_API, "JobSet")
    job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 4 and job["completionMode"] == "Indexed"


def test_a_multi_seed_experiment_renders_every_seed_run() -> None:
    exp = _smoke_seeds([7, 8])
    group = run_name(exp)
    objs = R.render_kubernetes(exp, namespace="ns1")
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        (kind, f"{group}-s{seed}-{suffix}")
        for seed in (7, 8)
        for kind, suffix in (("ConfigMap", "spec"), ("Job", "grpo"), ("Job", "eval"))
    ]
    # Every seed run exactly as a single run renders it, plus the group label on its children.
    assert objs == [o for r in seed_runs(exp) for o in R.render_run(r, namespace="ns1")]
    for obj in objs:
        kubernetes_validate.validate(obj, "1.32", strict=True)
        labels = obj["metadata"]["labels"]
        assert labels[C.LABEL_SEED_GROUP] == group and labels[C.LABEL_RUN_NAME].startswith(f"{group}-s")
        assert len(obj["metadata"]["name"]) <= 63
    for seed, cm in ((7, objs[0]), (8, objs[3])):
        mounted = parse_spec_text(cm["data"][C.SPEC_FILENAME], file="mounted.yaml")
        assert mounted.spec.algorithm.seed == seed and run_name(mounted) == f"{group}-s{seed}"
    job = objs[4]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": C.ENV_RUN_NAME, "value": f"{group}-s8"} in job["env"]
    assert job["command"][job["command"].index("--run-dir") + 1] == f"/runs/{group}-s8"
    # `longhaul render --backend kubernetes`: one stream with every seed run's manifests.
    ((name, text),) = render(exp, "kubernetes").files.items()
    assert name == f"{group}.k8s.yaml"
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(text)] == [
        o["metadata"]["name"] for o in R.render_kubernetes(exp)
    ]


def test_a_single_run_has_no_group_label() -> None:
    for obj in R.render_kubernetes(load_spec(ROOT / "specs/smoke.yaml")):
        assert C.LABEL_SEED_GROUP not in obj["metadata"]["labels"]
