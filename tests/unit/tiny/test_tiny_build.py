"""`longhaul tiny build` end to end through the CLI at a few warm-start steps: loadable models, the cache key
(reuse without rewriting), `--force`, and a seeded, deterministic build of both models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from longhaul.cli import app

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def _small_step0_spec(tmp_path, **evaluation):
    """specs/demo.yaml evaluated on one training task, one sample, two short turns (the estimate in seconds)."""
    doc = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
    doc["spec"]["environment"].update(
        split={"preset": "explicit", "train": [0], "test": [2]}, max_turns=2, max_tokens_per_turn=16
    )
    doc["spec"]["evaluation"].update(samples_per_task=1, k=[1], **evaluation)
    path = tmp_path / f"step0-{len(list(tmp_path.glob('step0-*')))}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_build_reuse_force_and_determinism(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    runner = CliRunner()
    out = tmp_path / "models"
    fast = ["--steps", "3", "--check-prompts", "0", "--user-steps", "3", "--check-user-tasks", "0"]
    res = runner.invoke(app, ["tiny", "build", "--out", str(out), *fast, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["cached"] is False and report["warmstart"]["steps"] == 3 and report["user_warmstart"]["steps"] == 3
    assert report["warmstart"]["examples"] > 0
    policy, user = out / "tiny-policy", out / "tiny-user"
    tok = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.hidden_size // cfg.num_attention_heads >= 32
    assert model.config.vocab_size >= len(tok) and tok.chat_template and tok.eos_token == "<|im_end|>"
    ucfg = AutoModelForCausalLM.from_pretrained(user).config
    assert ucfg.hidden_size // ucfg.num_attention_heads >= 32
    first, first_user = _digest(policy), _digest(user)
    mtime = (policy / "model.safetensors").stat().st_mtime_ns

    res = runner.invoke(app, ["tiny", "build", "--out", str(out), *fast, "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["cached"] is True
    assert (policy / "model.safetensors").stat().st_mtime_ns == mtime

    # A forced rebuild on the same machine: seeded and deterministic, the same weights.
    res = runner.invoke(app, ["tiny", "build", "--out", str(out), *fast, "--force", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["cached"] is False
    assert (_digest(policy), _digest(user)) == (first, first_user)
    assert json.loads(res.stdout)["arithmetic"]["mkl_cbwr"] == "AUTO,STRICT"


def test_a_build_that_misses_its_criteria_is_refused_and_writes_nothing(tmp_path):
    """Three warm-start steps cannot teach the tool-call format: the held-out checks say so, the CLI prints one
    line naming the criteria and exits 1, and the output directory holds no model. The step-0 estimate of the
    spec given (one task, one sample) is measured on the final weights and judged with the rest."""
    out = tmp_path / "models"
    spec = _small_step0_spec(tmp_path)
    args = ["tiny", "build", "--out", str(out), "--steps", "3", "--check-prompts", "2", "--user-steps", "3"]
    res = CliRunner().invoke(app, [*args, "--check-user-tasks", "0", "--step0-spec", str(spec)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    error = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "first_turn_well_formed" in error[0] and "p_tool_call_first_turn" in error[0]
    assert "NOT MET" in res.stderr
    step0 = [line for line in res.stderr.splitlines() if "demo_step0_train_pass1" in line]
    assert step0 and ("(0/1)" in step0[0] or "(1/1)" in step0[0]), res.stderr[-3000:]
    assert "demo_step0_train_pass1" in error[0]  # judged with the rest
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_build_key_sees_config_checks_and_inputs(tmp_path):
    from longhaul.tiny.build import TinyBuildConfig, compute_build_key

    conv = [[{"role": "user", "content": "x"}]]
    inputs = {"corpus": ["a"], "conversations": conv, "user_conversations": conv, "tools": []}
    key = compute_build_key(TinyBuildConfig(), inputs)
    # The checks decide where each warm start stops (`longhaul.tiny.gate`): they are part of the recipe.
    checks = ({"check_prompts": 0}, {"check_every": 50}, {"check_from": 100}, {"stop_on_criteria": False})
    for change in (*checks, {"check_user_tasks": 0}, {"user_check_every": 10}, {"user_check_from": 10}):
        assert compute_build_key(TinyBuildConfig(**change), inputs) != key, change
    assert compute_build_key(TinyBuildConfig(steps=7), inputs) != key
    assert compute_build_key(TinyBuildConfig(user_steps=7), inputs) != key
    assert compute_build_key(TinyBuildConfig(), {**inputs, "corpus": ["b"]}) != key
    assert compute_build_key(TinyBuildConfig(), {**inputs, "user_conversations": []}) != key
    # The step-0 criterion keys on what of its spec the estimate reads, not on the spec's training settings.
    gated = compute_build_key(TinyBuildConfig(step0_spec=str(_small_step0_spec(tmp_path))), inputs)
    assert gated != key
    trained = _small_step0_spec(tmp_path)
    doc = yaml.safe_load(trained.read_text())
    doc["spec"]["algorithm"]["learning_rate"] = 0.5
    trained.write_text(yaml.safe_dump(doc))
    assert compute_build_key(TinyBuildConfig(step0_spec=str(trained)), inputs) == gated
    seeds = _small_step0_spec(tmp_path, seeds=[1])
    assert compute_build_key(TinyBuildConfig(step0_spec=str(seeds)), inputs) != gated


def test_a_missing_or_invalid_step0_spec_is_one_line_and_builds_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: x}\nspec: {stages: [nope]}\n")
    for spec, says in ((tmp_path / "missing.yaml", "cannot read the step-0 spec"), (bad, "step-0 spec is not valid")):
        out = tmp_path / f"models-{spec.stem}"
        res = CliRunner().invoke(app, ["tiny", "build", "--out", str(out), "--step0-spec", str(spec)])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        error = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and says in error[0] and str(spec) in res.stderr, res.stderr
        assert not out.exists() or sorted(p.name for p in out.iterdir()) == [".lock"]
