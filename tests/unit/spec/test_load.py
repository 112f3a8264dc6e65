"""Spec loading: every shipped spec validates; a corpus of bad specs is rejected with the right field path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from longhaul.cli import app
from longhaul.spec import SpecError, load_spec, parse_spec_text, run_name

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.yaml"))
BASE = yaml.safe_load((ROOT / "specs" / "lata.yaml").read_text())


def test_six_specs_shipped_and_valid() -> None:
    stems = {p.stem for p in SPECS}
    assert {"vanilla", "turn_discount", "lata", "prm_lite", "prm_lite_lata", "smoke"} <= stems
    names = set()
    for path in SPECS:
        exp = load_spec(path)
        assert path.read_text().startswith("#"), f"{path.name} must start with a comment saying how to run it"
        names.add(run_name(exp))
    assert len(names) == len(SPECS)


def test_run_name_is_deterministic_and_ignores_annotations() -> None:
    a = parse_spec_text(yaml.safe_dump(BASE))
    doc = copy.deepcopy(BASE)
    doc["metadata"]["annotations"] = {"longhaul.dev/git-commit": "abc"}
    b = parse_spec_text(yaml.safe_dump(doc))
    doc["spec"]["algorithm"]["seed"] = 43
    c = parse_spec_text(yaml.safe_dump(doc))
    assert run_name(a) == run_name(b) != run_name(c)
    assert run_name(a).startswith("lata-") and len(run_name(a)) == len("lata-") + 8


def test_kubernetes_qualified_names_accepted() -> None:
    doc = _set(
        BASE,
        "spec.backends.kubernetes.tolerations",
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    doc = _set(doc, "spec.backends.kubernetes.node_selector", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    exp = parse_spec_text(yaml.safe_dump(doc))
    assert exp.spec.backends.kubernetes.tolerations[0].key == "nvidia.com/gpu"


def test_defaults_live_in_schema() -> None:
    exp = parse_spec_text("apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: x}\n")
    s = exp.spec
    assert s.user_simulator.model.name == "Qwen/Qwen2.5-72B-Instruct-AWQ"
    assert s.user_simulator.tensor_parallel_size == 2
    assert s.reward.weight == 0.3 and s.environment.tool_output_limit is None
    assert s.algorithm.loss_agg_mode == "seq-mean-token-mean"


def _set(doc: dict, path: str, value: Any) -> dict:
    doc = copy.deepcopy(doc)
    keys = path.split(".")
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


_DELETE = object()

# (mutation path, value, expected dotted path in the error, expected text fragment)
BAD_CASES: list[tuple[str, Any, str, str]] = [
    ("apiVersion", "longhaul.dev/v1", "apiVersion", "valid"),
    ("kind", "Experimnt", "kind", "did you mean 'Experiment'"),
    ("metadata.name", "Lata_Exp", "metadata.name", "DNS-1123"),
    ("metadata.name", "x" * 60, "metadata.name", "at most 54"),
    ("metadata.name", "evil;rm -rf /", "metadata.name", "DNS-1123"),
    ("metadata.name", _DELETE, "metadata.name", "required"),
    ("spec.algorithm.advantage", "lata2", "spec.algorithm.advantage", "did you mean 'lata'"),
    ("spec.algorithm.grup_size", 8, "spec.algorithm.grup_size", "did you mean 'group_size'"),
    ("spec.algorithm.group_size", "eight", "spec.algorithm.group_size", "not a whole number"),
    (
        "spec.algorithm.group_size",
        1,
        "spec.algorithm.group_size",
        "too small (got 1); write a whole number from 2 to 1,024",
    ),
    (
        "spec.algorithm.learning_rate",
        -1,
        "spec.algorithm.learning_rate",
        "too small (got -1); write a number above 0 and below 1",
    ),
    ("spec.algorithm.loss_agg_mode", "token-mean", "spec.algorithm.loss_agg_mode", "seq-mean-token-mean"),
    ("spec.algorithm.loss_agg_mode", "seq-mean", "spec.algorithm.loss_agg_mode", "valid"),
    ("spec.algorithm.ppo_mini_batch_size", 8, "spec.algorithm.ppo_mini_batch_size", "train_batch_size"),
    ("spec.algorithm.discount_unit", "turns", "spec.algorithm.discount_unit", "did you mean 'turn'"),
    ("spec.user_simulator.tensor_parallel_size", 4, "spec.user_simulator.tensor_parallel_size", "exceeds"),
    ("spec.user_simulator.gpu_memory_utilization", 0.6, "spec.user_simulator.gpu_memory_utilization", "above 0.90"),
    (
        "spec.user_simulator.gpu_memory_utilization",
        1.5,
        "spec.user_simulator.gpu_memory_utilization",
        "too large (got 1.5); write a number above 0, up to 1",
    ),
    ("spec.user_simulator.placement", "external", "spec.user_simulator.url", "needs `url`"),
    ("spec.user_simulator.url", "http://sim:8001/v1", "spec.user_simulator.url", "placement: external"),
    ("spec.policy.rollout.tensor_parallel_size", 3, "spec.policy.rollout.tensor_parallel_size", "exceeds"),
    ("spec.policy.model.name", "Qwen/../../etc", "spec.policy.model.name", "not allowed"),
    ("spec.policy.model.path", "/models/x; curl evil", "spec.policy.model.path", "not allowed"),
    ("spec.policy.model.revision", "main", "spec.policy.model.revision", "not allowed"),
    ("spec.policy.lora.rank", -2, "spec.policy.lora.rank", "write a whole number from 0 to 4,096"),
    ("spec.environment.domain", "retail", "spec.environment.domain", "valid"),
    ("spec.environment.split.preset", "seed40", "spec.environment.split.preset", "did you mean 'seed_40_10'"),
    ("spec.environment.split.train", [1, 2], "spec.environment.split", "only apply to preset 'explicit'"),
    ("spec.environment.max_turns", 0, "spec.environment.max_turns", "write a whole number from 1 to 1,000"),
    ("spec.environment.tool_output_limit", "lots", "spec.environment.tool_output_limit", "not a whole number"),
    ("spec.reward.process", "prm", "spec.reward.process", "valid"),
    ("spec.reward.credit", "step", "spec.reward.credit", "valid"),
    ("spec.reward.rules", {"placeholdr": {"weight": 1}}, "spec.reward.rules.placeholdr", "did you mean 'placeholder'"),
    (
        "spec.reward.rules",
        {"redundancy": {"wieght": 1}},
        "spec.reward.rules.redundancy.wieght",
        "did you mean 'weight'",
    ),
    ("spec.reward.rules", {"redundancy": {"enabled": 3}}, "spec.reward.rules.redundancy.enabled", "boolean"),
    ("spec.evaluation.k", [1, 16], "spec.evaluation.samples_per_task", "max k"),
    ("spec.evaluation.select_on", "test", "spec.evaluation.select_on", "must not be 'test'"),
    ("spec.evaluation.select_on", "unseen", "spec.evaluation.select_on", "holds the test tasks"),
    ("spec.stages", ["eval", "grpo"], "spec.stages", "order"),
    ("spec.stages", ["sft", "grpo"], "spec.sft", "missing"),
    ("spec.tracking.uri", "javascript:alert(1)", "spec.tracking.uri", "not allowed"),
    ("spec.tracking.tags", {"note": "a\nb"}, "spec.tracking.tags.note", "not allowed"),
    ("spec.resources.gpus_per_node", 1, "spec.user_simulator.tensor_parallel_size", "exceeds"),
    ("spec.resources.time_limit", "3 days", "spec.resources.time_limit", "not allowed"),
    ("spec.resources.memory", "512GB", "spec.resources.memory", "not allowed"),
    (
        "spec.algorithm.ppo_micro_batch_size_per_gpu",
        3,
        "spec.algorithm.ppo_micro_batch_size_per_gpu",
        "micro-batches of 3",
    ),
    ("spec.backends.slurm.partition", "gpu; rm -rf /", "spec.backends.slurm.partition", "not allowed"),
    ("spec.backends.slurm.account", "$(whoami)", "spec.backends.slurm.account", "not allowed"),
    ("spec.backends.slurm.output_dir", "runs/`id`", "spec.backends.slurm.output_dir", "not allowed"),
    (
        "spec.backends.slurm.setup",
        ["module load cuda", "echo ok\nrm -rf /"],
        "spec.backends.slurm.setup[1]",
        "control characters",
    ),
    ("spec.backends.slurm.setup", ["#SBATCH --exclusive"], "spec.backends.slurm.setup[0]", "#SBATCH"),
    ("spec.backends.slurm.container.runtime", "docker", "spec.backends.slurm.container.runtime", "valid"),
    (
        "spec.backends.slurm.container.image",
        "/img.sif && reboot",
        "spec.backends.slurm.container.image",
        "not an image",
    ),
    ("spec.backends.kubernetes.image", "Evil Image:latest", "spec.backends.kubernetes.image", "not allowed"),
    ("spec.backends.kubernetes.namespace", "Prod_NS", "spec.backends.kubernetes.namespace", "not allowed"),
    (
        "spec.backends.kubernetes.node_selector",
        {"gpu": "a b"},
        "spec.backends.kubernetes.node_selector.gpu",
        "not allowed",
    ),
    (
        "spec.backends.kubernetes.node_selector",
        {"bad key;": "x"},
        "spec.backends.kubernetes.node_selector.bad key;",
        "not allowed",
    ),
    (
        "spec.backends.kubernetes.tolerations",
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "Evil"}],
        "spec.backends.kubernetes.tolerations[0].effect",
        "valid",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "where", "fragment"), BAD_CASES, ids=[c[0] + ":" + str(i) for i, c in enumerate(BAD_CASES)]
)
def test_bad_spec_rejected_with_field_path(tmp_path: Path, path: str, value: Any, where: str, fragment: str) -> None:
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(yaml.safe_dump(_set(BASE, path, value), sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(spec_file)
    problems = info.value.problems
    match = [p for p in problems if p.path == where]
    assert match, f"no problem at {where}: {[p.render() for p in problems]}"
    rendered = match[0].render()
    assert fragment.lower() in rendered.lower(), rendered
    assert rendered.startswith(f"{spec_file}:"), rendered
    assert match[0].line is not None


RAW_CASES = [
    (
        "apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: a}\nspec: !!python/object/apply:os.system ['id']\n",  # noqa: E501 - a string literal kept whole
        "tags",
    ),
    ("apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata:\n  name: a\n  name: b\n", "duplicate key"),
    ("apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: a\n", "invalid YAML"),
    ("- just\n- a list\n", "must be a mapping"),
    ("", "empty document"),
    (
        "apiVersion: longhaul.dev/v1alpha1\nkind: Experiment\nmetadata: {name: a}\n---\napiVersion: x\n",
        "one YAML document",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), RAW_CASES)
def test_bad_yaml_rejected(tmp_path: Path, text: str, fragment: str) -> None:
    f = tmp_path / "raw.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(f)
    assert fragment in str(info.value)


def test_line_numbers_point_at_the_field(tmp_path: Path) -> None:
    text = (ROOT / "specs" / "lata.yaml").read_text().replace("advantage: lata", "advantage: latta")
    f = tmp_path / "typo.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(f)
    (p,) = info.value.problems
    assert text.splitlines()[p.line - 1].strip() == "advantage: latta"


def test_every_problem_reported_at_once(tmp_path: Path) -> None:
    doc = _set(
        _set(_set(BASE, "spec.algorithm.advantage", "x"), "spec.environment.max_turns", -1), "metadata.name", "A"
    )
    f = tmp_path / "multi.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as info:
        load_spec(f)
    paths = {p.path for p in info.value.problems}
    assert {"spec.algorithm.advantage", "spec.environment.max_turns", "metadata.name"} <= paths


def test_cli_validate_and_render_write_nothing_on_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_set(BASE, "spec.algorithm.advantage", "lata2")))
    good = ROOT / "specs" / "lata.yaml"
    runner = CliRunner()
    res = runner.invoke(app, ["validate", str(good), str(bad)])
    assert res.exit_code == 2
    assert "spec.algorithm.advantage" in res.output and "nothing was rendered" in res.output
    out = tmp_path / "out"
    res = runner.invoke(app, ["render", str(bad), "--backend", "local", "--out", str(out)])
    assert res.exit_code == 2 and not out.exists()
    res = runner.invoke(app, ["render", str(good), "--backend", "local", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(list(out.iterdir())) == 1


def test_seed_compat_refuses_turn_credit(tmp_path: Path) -> None:
    doc = _set(BASE, "spec.algorithm.seed_compat", True)
    doc = _set(doc, "spec.algorithm.loss_agg_mode", "token-mean")
    doc = _set(doc, "spec.algorithm.discount_unit", "token")
    parse_spec_text(yaml.safe_dump(doc))  # seed_compat with trajectory credit is valid
    f = tmp_path / "seed_turn.yaml"
    f.write_text(yaml.safe_dump(_set(doc, "spec.reward.credit", "turn"), sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(f)
    match = [p for p in info.value.problems if p.path == "spec.reward.credit"]
    assert match and "no per-turn credit" in match[0].render() and match[0].line is not None


def test_cpu_run_spans_nodes_one_rank_per_node(tmp_path: Path) -> None:
    """gpus_per_node: 0 with nodes > 1: one CPU trainer rank per node, so the rollouts and each rank's mini-batch
    share must divide by the node count (specs/smoke.yaml: 2 tasks × 4 rollouts, mini-batch 1 × 4)."""
    smoke = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    ok = _set(_set(smoke, "spec.resources.nodes", 2), "spec.algorithm.ppo_micro_batch_size_per_gpu", 2)
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(ok, sort_keys=False))
    assert load_spec(tmp_path / "ok.yaml").spec.resources.nodes == 2
    for nodes, where, fragment in (
        (3, "spec.algorithm.train_batch_size", "3 CPU trainer rank(s), one per node"),
        (2, "spec.algorithm.ppo_micro_batch_size_per_gpu", "each of the trainer's 2 rank(s)"),
    ):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(_set(smoke, "spec.resources.nodes", nodes)))
        with pytest.raises(SpecError) as info:
            load_spec(tmp_path / "bad.yaml")
        assert [p for p in info.value.problems if p.path == where and fragment in p.render()], info.value.problems


def test_cpu_run_needs_one_prefill_batch_for_the_longest_context() -> None:
    """vLLM-CPU prefills without chunking: a CPU spec whose max_num_batched_tokens is below max_model_len is refused
    with the field and the fix (a GPU spec may chunk)."""
    from longhaul.spec.models import Experiment

    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["policy"]["rollout"]["max_num_batched_tokens"] = 4096
    with pytest.raises(Exception, match=r"policy\.rollout\.max_num_batched_tokens.*>= max_model_len"):
        Experiment.model_validate(doc)
