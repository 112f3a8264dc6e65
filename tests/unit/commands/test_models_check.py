"""`longhaul models check`: offline model resolution through HF_HOME or `path` (longhaul.commands.images)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("huggingface_hub")

from longhaul.cli import app  # noqa: E402
from longhaul.commands.images import ModelNotBaked, find_baked_model  # noqa: E402
from longhaul.spec.serving import ModelRef  # noqa: E402

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def bake(hf_home: Path, repo: str, *, weights: bool = True, ref_main: bool = True) -> Path:
    """An HF cache entry laid out as `hf download` + images/bake-models.sh leave it."""
    entry = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snap = entry / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"model_type": "llama"}')
    if weights:
        (snap / "model.safetensors").write_bytes(b"\0" * 16)
    if ref_main:
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text(COMMIT)
    return snap


def spec(tmp_path: Path, policy: str, simulator: str, placement: str = "colocated") -> Path:
    sim_extra = ", placement: external, url: http://sim:8001/v1" if placement == "external" else ""
    path = tmp_path / "exp.yaml"
    path.write_text(
        "apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: baked}\nspec:\n"
        f"  policy: {{model: {policy}}}\n  user_simulator: {{model: {simulator}{sim_extra}}}\n"
    )
    return path


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return home


def test_resolves_baked_model_by_name_and_by_pinned_revision(hf_home: Path) -> None:
    snap = bake(hf_home, "org/policy")
    assert find_baked_model(ModelRef(name="org/policy")) == snap
    assert find_baked_model(ModelRef(name="org/policy", revision=COMMIT)) == snap


def test_unbaked_model_names_model_field_and_fix(hf_home: Path) -> None:
    bake(hf_home, "org/policy")
    with pytest.raises(ModelNotBaked) as exc:
        find_baked_model(ModelRef(name="org/other"), field="spec.policy.model")
    msg = str(exc.value)
    assert "spec.policy.model.name" in msg and "'org/other'" in msg and str(hf_home / "hub") in msg
    assert "POLICY_MODEL=org/other" in msg and "spec.policy.model.path" in msg


def test_other_revision_than_baked_is_missing(hf_home: Path) -> None:
    bake(hf_home, "org/policy")
    with pytest.raises(ModelNotBaked, match="revision " + "f" * 40):
        find_baked_model(ModelRef(name="org/policy", revision="f" * 40))


def test_snapshot_without_weights_is_incomplete(hf_home: Path) -> None:
    bake(hf_home, "org/policy", weights=False)
    with pytest.raises(ModelNotBaked, match="no weights"):
        find_baked_model(ModelRef(name="org/policy"))


def test_path_is_resolved_relative_to_cwd(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    ref = ModelRef(name="x/tiny", path="models/tiny")
    with pytest.raises(ModelNotBaked, match="no weights"):
        find_baked_model(ref, cwd=tmp_path)
    (model / "model.safetensors").write_bytes(b"\0")
    assert find_baked_model(ref, cwd=tmp_path) == model
    with pytest.raises(ModelNotBaked, match="does not exist"):
        find_baked_model(ModelRef(name="x/tiny", path="nowhere"), cwd=tmp_path)


def test_cli_ok_and_failure(hf_home: Path, tmp_path: Path) -> None:
    bake(hf_home, "org/policy")
    bake(hf_home, "org/sim")
    runner = CliRunner()
    ok = runner.invoke(app, ["models", "check", str(spec(tmp_path, "{name: org/policy}", "{name: org/sim}"))])
    assert ok.exit_code == 0, ok.output
    assert ok.output.count("ok ") == 2 and "user_simulator org/sim" in ok.output

    bad = runner.invoke(app, ["models", "check", str(spec(tmp_path, "{name: org/policy}", "{name: org/absent}"))])
    assert bad.exit_code == 1
    assert "spec.user_simulator.model.name: model 'org/absent'" in bad.output
    assert "1 model(s) missing" in bad.output


def test_cli_skips_external_simulator(hf_home: Path, tmp_path: Path) -> None:
    bake(hf_home, "org/policy")
    path = spec(tmp_path, "{name: org/policy}", "{name: org/absent}", placement="external")
    result = CliRunner().invoke(app, ["models", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "org/absent" not in result.output


def test_cli_reports_spec_errors_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: Bad_Name}\nspec: {}\n")
    result = CliRunner().invoke(app, ["models", "check", str(path)])
    assert result.exit_code == 2


def test_sft_teacher_is_needed_only_when_collected_in_the_job(hf_home: Path, tmp_path: Path) -> None:
    bake(hf_home, "org/policy")
    bake(hf_home, "org/sim")
    base = spec(tmp_path, "{name: org/policy}", "{name: org/sim}").read_text()
    collect = tmp_path / "sft.yaml"
    collect.write_text(base + "  stages: [sft, grpo]\n  sft: {teacher: {model: {name: org/teacher}}}\n")
    result = CliRunner().invoke(app, ["models", "check", str(collect)])
    assert result.exit_code == 1
    assert "spec.sft.teacher.model.name: model 'org/teacher'" in result.output
    assert "SIMULATOR_MODEL=org/teacher" in result.output  # served like the simulator

    given = tmp_path / "sft-dataset.yaml"
    given.write_text(
        base + "  stages: [sft, grpo]\n  sft: {dataset: data/traj.jsonl, teacher: {model: {name: org/teacher}}}\n"
    )
    assert CliRunner().invoke(app, ["models", "check", str(given)]).exit_code == 0


def test_same_model_for_two_roles_is_checked_once(hf_home: Path, tmp_path: Path) -> None:
    bake(hf_home, "org/policy")
    result = CliRunner().invoke(
        app, ["models", "check", str(spec(tmp_path, "{name: org/policy}", "{name: org/policy}"))]
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("ok ") == 1
