"""`longhaul plan`, and the memory check in `validate` (a warning) and `submit` (a refusal unless
--ignore-memory-plan)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from longhaul.cli import app
from support.specs import SPECS_DIR


def _l40s(tmp_path: Path) -> Path:
    text = (SPECS_DIR / "prm_lite_lata.yaml").read_text()
    assert "gpu_type: a800" in text
    path = tmp_path / "l40s.yaml"
    path.write_text(text.replace("gpu_type: a800", "gpu_type: l40s"))
    return path


def test_plan_prints_every_phase_per_gpu() -> None:
    res = CliRunner().invoke(app, ["plan", str(SPECS_DIR / "prm_lite_lata.yaml")])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for needle in (
        "a800, 80.0 GiB each",
        "rollout: policy engine generating",
        "weight sync: training → rollout",
        "training: policy engine asleep (level 1)",
        "evaluation: policy server and simulator",
        "user simulator vLLM (0.40 × GPU, TP 2)",
        "policy rollout vLLM (0.50 × GPU, TP 1)",
        "activations (2 × 20,480 tokens, checkpointing on)",
        "without gradient checkpointing",
        "KV cache",
        "tokens × 56 KiB",
        "sleep ",
        "verdict",
        "headroom",
    ):
        assert needle in out, needle
    assert "DOES NOT FIT" not in out


def test_plan_json() -> None:
    res = CliRunner().invoke(app, ["plan", str(SPECS_DIR / "lata.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [p["name"] for p in doc["phases"]] == ["rollout", "sync", "training", "evaluation"]
    assert all(v == "fits" for p in doc["phases"] for v in p["verdict"]) and doc["issues"] == []


def test_plan_exits_1_when_a_phase_does_not_fit(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["plan", str(_l40s(tmp_path))])
    assert res.exit_code == 1
    assert "OVER" in res.stdout and "DOES NOT FIT spec.algorithm.ppo_micro_batch_size_per_gpu" in res.stdout


def test_plan_of_an_unknown_model_exits_2(tmp_path: Path) -> None:
    doc = yaml.safe_load((SPECS_DIR / "lata.yaml").read_text())
    doc["spec"]["policy"]["model"] = {"name": "acme/mystery-7b"}
    path = tmp_path / "mystery.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 2
    assert "no shape for model 'acme/mystery-7b'" in res.output and "spec.policy.model.path" in res.output


def test_validate_warns_with_file_line_and_field_but_keeps_exit_0(tmp_path: Path) -> None:
    path = _l40s(tmp_path)
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output
    assert f"ok {path}" in res.stdout
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "ppo_micro_batch_size_per_gpu" in s)
    assert f"warning {path}:{line} spec.algorithm.ppo_micro_batch_size_per_gpu: the training phase" in res.stderr


def test_validate_of_shipped_gpu_specs_prints_no_memory_warning() -> None:
    files = [str(p) for p in sorted(SPECS_DIR.glob("*.yaml")) if p.stem != "smoke"]
    res = CliRunner().invoke(app, ["validate", *files])
    assert res.exit_code == 0 and res.stderr == "", res.stderr


def test_submit_refuses_and_writes_nothing_unless_ignored(tmp_path: Path, monkeypatch) -> None:
    path = _l40s(tmp_path)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for extra in ([], ["--dry-run"]):
        res = runner.invoke(app, ["submit", str(path), "--backend", "slurm", *extra])
        assert res.exit_code == 2, res.output
        assert "error" in res.stderr and "nothing was written or submitted" in res.stderr
        assert "--ignore-memory-plan" in res.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["l40s.yaml"]
    res = runner.invoke(app, ["submit", str(path), "--backend", "slurm", "--dry-run", "--ignore-memory-plan"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("#!/bin/bash") and "--ignore-memory-plan" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l40s.yaml"]  # a dry run writes nothing either


def test_submit_takes_a_separate_async_spec_whose_gpus_fit(tmp_path: Path, monkeypatch) -> None:
    """The plan models separate_async's rollout GPUs: a layout that fits is submitted without
    --ignore-memory-plan, and `plan` prints the standalone replicas' phases."""
    doc = yaml.safe_load((SPECS_DIR / "lata.yaml").read_text())
    doc["spec"]["resources"]["gpus_per_node"] = 8
    doc["spec"]["user_simulator"]["gpu_share"] = "dedicated"
    doc["spec"]["algorithm"]["trainer"] = {"mode": "separate_async", "rollout_gpus_per_node": 2}
    doc["spec"]["policy"]["lora"] = {"rank": 0}  # separate_async with LoRA is refused by the spec
    path = tmp_path / "separate.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 0, res.output
    assert "weight sync: trainer → standalone replicas" in res.stdout and "DOES NOT FIT" not in res.stdout
    res = CliRunner().invoke(app, ["submit", str(path), "--backend", "slurm", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("#!/bin/bash") and "memory plan" not in res.stderr


def test_a_missing_local_model_skips_the_check_with_a_hint(tmp_path: Path, monkeypatch) -> None:
    """The smoke spec before `longhaul tiny build`: validate and submit go on, and say why there is no plan."""
    path = tmp_path / "smoke.yaml"
    path.write_text((SPECS_DIR / "smoke.yaml").read_text())
    monkeypatch.chdir(tmp_path)  # .cache/longhaul/models/tiny-policy does not exist here
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output
    assert "memory plan skipped" in res.stderr and "longhaul tiny build" in res.stderr
    res = CliRunner().invoke(app, ["submit", str(path), "--backend", "slurm", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "memory plan skipped" in res.stderr and res.stdout.startswith("#!/bin/bash")
