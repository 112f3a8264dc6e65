"""`spec.policy.thinking`: which values a model family accepts, and what reaches veRL, the policy server and SFT.

The token-level proofs (training sequence = generated tokens, evaluation context = training context, exact SFT
masks, vLLM's hermes parser) are in tests/unit/agentloop/test_qwen3_thinking.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from longhaul.chat.thinking import (
    chat_template_kwargs,
    chat_template_override,
    load_qwen3_template,
    visible_text,
)
from longhaul.layout import Paths
from longhaul.render.plan import render_chat_args, render_policy_server
from longhaul.render.verl import render_chat_overrides, render_verl_overrides
from longhaul.spec import SpecError, load_spec, parse_spec_text
from longhaul.spec.policy import model_thinks

ROOT = Path(__file__).resolve().parents[3]
QWEN3 = yaml.safe_load((ROOT / "specs" / "qwen3_8b.yaml").read_text())


def _spec(thinking: str, *, model: str = "Qwen/Qwen3-8B", stages: list[str] | None = None) -> str:
    doc = yaml.safe_load(yaml.safe_dump(QWEN3))
    doc["spec"]["policy"]["model"] = {"name": model}
    doc["spec"]["policy"]["thinking"] = thinking
    if stages is not None:
        doc["spec"]["stages"] = stages
        if "sft" in stages:
            doc["spec"]["sft"] = {}
    return yaml.safe_dump(doc, sort_keys=False)


def _problem(tmp_path: Path, text: str, path: str) -> str:
    f = tmp_path / "spec.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(f)
    match = [p for p in info.value.problems if p.path == path]
    assert match, [p.render() for p in info.value.problems]
    assert match[0].line is not None
    return match[0].render()


def test_thinking_family_is_read_from_the_model_name() -> None:
    for name in ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "qwen/qwen3-0.6b", "longhaul/tiny-qwen3-policy"):
        assert model_thinks(name), name
    for name in (
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen3-4B-Instruct-2507",
        "Qwen/Qwen3-4B-Thinking-2507",
        "Qwen/Qwen3.5-9B",
        "longhaul/tiny-qwen2-policy",
        "meta-llama/Llama-3.1-8B-Instruct",
    ):
        assert not model_thinks(name), name


def test_a_model_without_thinking_refuses_keep_and_strip(tmp_path: Path) -> None:
    for mode in ("keep", "strip"):
        msg = _problem(tmp_path, _spec(mode, model="Qwen/Qwen2.5-7B-Instruct", stages=["eval"]), "spec.policy.thinking")
        assert f"'{mode}' needs a Qwen3 hybrid-thinking policy" in msg and "use thinking: disabled" in msg
    exp = parse_spec_text(_spec("disabled", model="Qwen/Qwen2.5-7B-Instruct"))
    assert chat_template_kwargs(exp.spec.policy) == {} and chat_template_override(exp.spec.policy) is None


def test_strip_cannot_train_but_can_evaluate(tmp_path: Path) -> None:
    for stages in (["grpo", "eval"], ["sft", "eval"]):
        msg = _problem(tmp_path, _spec("strip", stages=stages), "spec.policy.thinking")
        assert "'strip' cannot train" in msg and "not a prefix of the training sequence" in msg
        assert "use keep or disabled" in msg
    exp = parse_spec_text(_spec("strip", stages=["eval"]))
    # Qwen3's own template and rendering: nothing replaced, thinking on.
    assert chat_template_override(exp.spec.policy) is None
    assert chat_template_kwargs(exp.spec.policy) == {"enable_thinking": True}
    argv = render_policy_server(exp).argv
    assert "--chat-template" not in argv
    assert argv[argv.index("--default-chat-template-kwargs") + 1] == '{"enable_thinking": true}'


def test_every_shipped_spec_without_a_thinking_model_renders_as_before() -> None:
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        exp = load_spec(path)
        if model_thinks(exp.spec.policy.model.name):
            continue
        assert exp.spec.policy.thinking == "disabled"
        assert render_chat_overrides(exp) == [] and render_chat_args(exp) == (), path.name


@pytest.mark.verl
@pytest.mark.parametrize(
    "mode, kwargs",
    [
        ("disabled", {"enable_thinking": False, "preserve_thinking": True}),
        ("keep", {"enable_thinking": True, "preserve_thinking": True}),
    ],
)
def test_template_and_kwargs_reach_verl_and_the_policy_server(mode: str, kwargs: dict) -> None:
    """veRL's own Hydra composition receives longhaul's template byte for byte (Hydra keeps the template's
    backslashes) and the keyword arguments as booleans; the policy server gets the same template and kwargs."""
    from support.verl_config import compose_verl

    exp = parse_spec_text(_spec(mode))
    assert chat_template_kwargs(exp.spec.policy) == kwargs
    cfg = compose_verl(render_verl_overrides(exp, Paths.under("/runs/r")))
    assert cfg.actor_rollout_ref.model.custom_chat_template == load_qwen3_template()
    assert dict(cfg.data.apply_chat_template_kwargs) == kwargs
    argv = render_policy_server(exp).argv
    assert argv[argv.index("--chat-template") + 1] == load_qwen3_template()
    assert json.loads(argv[argv.index("--default-chat-template-kwargs") + 1]) == kwargs
    # a checkpoint is served with the same template (evaluation of every checkpoint)
    assert render_policy_server(exp, model_dir="/runs/r/ckpt/global_step_50").argv[-4:] == argv[-4:]


def test_the_shipped_qwen3_spec() -> None:
    exp = load_spec(ROOT / "specs" / "qwen3_8b.yaml")
    assert exp.spec.policy.model.name == "Qwen/Qwen3-8B" and exp.spec.policy.thinking == "disabled"
    assert exp.spec.user_simulator.model.name == "Qwen/Qwen2.5-72B-Instruct-AWQ"
    assert exp.spec.reward.process == "prm_lite" and exp.spec.algorithm.advantage == "lata"
    argv = render_policy_server(exp).argv
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"


def test_visible_text_is_what_follows_the_think_block() -> None:
    assert visible_text("<think>\nplan\n</think>\n\nHello.") == "Hello."
    assert visible_text("<think>\n\n</think>\n\nHello.") == "Hello."
    assert visible_text("<think>\nstill thinking") == ""
    assert visible_text("Hello, no thinking.") == "Hello, no thinking."
