"""Provenance tags and the τ² data hash (pure parts, plus reading a data directory)."""

from __future__ import annotations

import hashlib

from longhaul.analysis import tags as T
from longhaul.spec import build_experiment, experiment_family, run_name, spec_hash
from longhaul.tracking.provenance import (
    NOT_INSTALLED,
    build_params,
    build_provenance,
    compute_dataset_hash,
    fetch_dataset_hash,
    package_versions,
)


def exp(annotations=None, tags=None):
    return build_experiment({
        "apiVersion": "longhaul.dev/v1alpha1", "kind": "Experiment",
        "metadata": {"name": "prov", "annotations": annotations or {}},
        "spec": {"resources": {"gpus_per_node": 0}, "policy": {"lora": {"rank": 0}}, "algorithm": {"advantage": "lata"},
                 "reward": {"process": "prm_lite"}, "tracking": {"tags": tags or {}}},
    })  # fmt: skip


def test_provenance_tags():
    e = exp(tags={"team": "rl"})
    env = {
        "LONGHAUL_GIT_COMMIT": "c" * 40,
        "LONGHAUL_IMAGE": "reg/img@sha256:" + "a" * 64,
        "LONGHAUL_BACKEND": "slurm",
        "LONGHAUL_JOB_ID": "4242",
    }
    t = build_provenance(
        e, backend="local", environ=env, versions={"verl": "0.9.1", "vllm": NOT_INSTALLED}, dataset_sha256="d" * 64
    )
    assert t[T.SPEC_HASH] == spec_hash(e) and t[T.RUN_NAME] == run_name(e)
    assert t[T.FAMILY] == experiment_family(e) == "longhaul/prov"
    assert t[T.GIT_COMMIT] == "c" * 40
    assert t[T.IMAGE].endswith("a" * 64)
    assert (t[T.BACKEND], t[T.JOB_ID]) == ("slurm", "4242")  # the job's own view wins over the caller's
    assert t[T.DATASET_SHA256] == "d" * 64
    assert t["longhaul.version.verl"] == "0.9.1" and t["longhaul.version.vllm"] == NOT_INSTALLED
    assert (t[T.ADVANTAGE], t[T.PROCESS_REWARD]) == ("lata", "prm_lite")
    assert t["team"] == "rl"
    assert "spec/experiment.yaml" in t["mlflow.note.content"]


def test_git_commit_annotation_beats_environment_and_unknowns_are_explicit():
    e = exp(annotations={"longhaul.dev/git-commit": "b" * 40})
    t = build_provenance(
        e, backend="kubernetes", environ={"LONGHAUL_GIT_COMMIT": "c" * 40}, versions={}, dataset_sha256="x"
    )
    assert t[T.GIT_COMMIT] == "b" * 40
    bare = build_provenance(exp(), backend="kubernetes", environ={}, versions={}, dataset_sha256="x")
    assert (bare[T.GIT_COMMIT], bare[T.IMAGE], bare[T.JOB_ID], bare[T.BACKEND]) == (
        "unknown",
        "unknown",
        "unknown",
        "kubernetes",
    )


def test_params_are_flat_strings_under_spec_prefix():
    p = build_params(exp())
    assert p["spec.algorithm.advantage"] == "lata"
    assert p["spec.evaluation.k"] == "1,2,4"
    assert all(k.startswith("spec.") and isinstance(v, str) for k, v in p.items())
    assert len(p) <= 100  # one log_batch request


def test_dataset_hash_is_order_independent_and_content_sensitive(tmp_path):
    a = [("tasks.json", b"[1]"), ("db.json", b"{}")]
    assert compute_dataset_hash(a) == compute_dataset_hash(list(reversed(a)))
    assert compute_dataset_hash(a) != compute_dataset_hash([("tasks.json", b"[2]"), ("db.json", b"{}")])
    assert compute_dataset_hash(a) != compute_dataset_hash([("tasks2.json", b"[1]"), ("db.json", b"{}")])
    (tmp_path / "sub").mkdir()
    (tmp_path / "tasks.json").write_bytes(b"[1]")
    (tmp_path / "sub" / "db.json").write_bytes(b"{}")
    lines = sorted(
        f"{n}\0{hashlib.sha256(d).hexdigest()}\n" for n, d in [("tasks.json", b"[1]"), ("sub/db.json", b"{}")]
    )
    assert fetch_dataset_hash(tmp_path) == hashlib.sha256("".join(lines).encode()).hexdigest()


def test_installed_tau2_data_is_hashed():
    digest = fetch_dataset_hash()
    assert len(digest) == 64 and digest != NOT_INSTALLED


def test_missing_packages_are_recorded_as_not_installed():
    v = package_versions(["pydantic", "surely-not-a-real-distribution-xyz"])
    assert v["surely-not-a-real-distribution-xyz"] == NOT_INSTALLED
    assert v["pydantic"][0].isdigit()
