"""The longhaul agent loop inside real veRL 0.9.1 on CPU.

veRL's own config (Hydra compose of ppo_trainer with the rendered overrides), veRL's own instantiation of the
rendered `agent_loop_config_path` entry, veRL's continuous-token builder and output path; only the LLM server
manager is a scripted token-level stand-in (it replays a task's gold actions as Hermes tool calls) and the user
simulator is scripted.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import yaml

pytestmark = pytest.mark.verl

CHAT_TEMPLATE = (
    "{%- set ns = namespace(start=0) -%}"
    "{%- if tools -%}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% set ns.start = 1 %}{% endif %}\n"
    "# Tools\n<tools>\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools><|im_end|>\n"
    "{%- endif -%}"
    "{%- for m in messages[ns.start:] -%}"
    "{%- if m.role == 'tool' -%}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' -%}<|im_start|>assistant\n{{ m.content }}"
    "{%- for tc in (m.tool_calls or []) %}\n<tool_call>\n"
    "{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def make_tokenizer():
    """A byte-level tokenizer (one token per byte) with Hermes special tokens and a minimal chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<tool_call>", "</tool_call>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


class ScriptedServer:
    """Stand-in for veRL's LLM server manager: returns scripted completions as token ids with log-probs."""

    def __init__(self, tokenizer, completions):
        self.tokenizer = tokenizer
        self.completions = list(completions)
        self.calls = []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        text = self.completions.pop(0) if self.completions else "Goodbye.<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


class ScriptedUser:
    def __init__(self, opening="Hi, I need to change my reservation."):
        self.opening = opening
        self.calls = 0

    async def reply(self, task, conversation):
        self.calls += 1
        return self.opening if not conversation else "Thanks, that is all. ###STOP###"


SPEC_YAML = """
apiVersion: longhaul.dev/v1alpha1
kind: Experiment
metadata: {name: loop-test}
spec:
  environment: {max_prompt_tokens: 200000, max_response_tokens: 100000, max_turns: 12}
  reward: {process: prm_lite, weight: 0.3, credit: turn}
"""


@pytest.fixture(scope="module")
def verl_config(tmp_path_factory):
    import verl
    from hydra import compose, initialize_config_dir

    from longhaul.agentloop.config import agent_loop_overrides, render_agent_loop_yaml
    from longhaul.spec.load import parse_spec_text

    exp = parse_spec_text(SPEC_YAML)
    path = tmp_path_factory.mktemp("loop") / "agent_loops.yaml"
    path.write_text(render_agent_loop_yaml(exp))
    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=agent_loop_overrides(str(path), exp))
    return cfg, path


def build_loop(verl_config, server, monkeypatch, user=None):
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop

    cfg, path = verl_config
    entries = OmegaConf.load(path)
    entry = next(e for e in entries if e.name == cfg.actor_rollout_ref.rollout.agent.default_agent_loop)
    user = user or ScriptedUser()
    monkeypatch.setattr(LonghaulAirlineAgentLoop, "make_user_simulator", lambda self, row: user)
    loop = hydra.utils.instantiate(
        config=entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
        tokenizer=server.tokenizer, processor=None, hf_model_type=None, dataset_cls=None,
        data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]),
    )
    assert type(loop) is LonghaulAirlineAgentLoop
    return loop, user


def gold_completions(task_id, *, corrupt=False):
    from longhaul.envs.airline.tasks import get_task

    task = get_task(task_id)
    out = []
    for i, a in enumerate(task.actions):
        args = dict(a.arguments)
        if corrupt and i == 0:
            args = {**args, "cabin": "economy" if args.get("cabin") != "economy" else "business"}
        call = json.dumps({"name": a.name, "arguments": args})
        out.append(f"I will do that now for you, one moment please.\n<tool_call>\n{call}\n</tool_call><|im_end|>")
    said = ", ".join(task.communicate_info)
    out.append(f"All done. For your records: {said}. Is there anything else?<|im_end|>")
    return task, out


ROW = {"raw_prompt": [{"role": "user", "content": "unused"}], "extra_info": {"task_id": "11"}, "uid": "u0"}


async def run_loop(verl_config, monkeypatch, completions):
    tok = make_tokenizer()
    server = ScriptedServer(tok, completions)
    loop, user = build_loop(verl_config, server, monkeypatch)
    out = await loop.run({"temperature": 1.0, "top_p": 1.0}, **ROW)
    return out, server, tok


async def test_gold_replay_scores_one(verl_config, monkeypatch):
    from longhaul.envs.airline.tasks import policy_text

    task, completions = gold_completions("11")
    assert task.writes and task.communicate_info
    out, server, tok = await run_loop(verl_config, monkeypatch, completions)
    info = out.extra_fields["reward_extra_info"]
    assert info["outcome"] == 1.0 and info["acc"] == 1.0, out.extra_fields
    assert out.reward_score == pytest.approx(1.0 + 0.3 * info["process"])
    assert info["num_tool_calls"] == len(task.actions) and info["aborted"] == 0.0
    # The prompt holds the policy text and the first user message; the response holds neither.
    prompt = tok.decode(out.prompt_ids)
    assert policy_text().strip()[:200] in prompt and "Hi, I need to change my reservation." in prompt
    response = tok.decode(out.response_ids)
    assert "Hi, I need to change my reservation." not in response and "<tool_response>" in response
    # Mask: policy tokens are exactly the generated completions; tool results have mask 0.
    mask = torch.tensor(out.response_mask)
    generated = sum(len(tok.encode(c, add_special_tokens=False)) for c in completions)
    assert int(mask.sum()) == generated and len(out.response_ids) == len(mask) > generated
    assert out.response_logprobs is not None and len(out.response_logprobs) == len(mask)
    # Every generate call continued the previous token stream (token-in/token-out, no re-tokenisation).
    for a, b in zip(server.calls, server.calls[1:], strict=False):
        assert b["prompt_ids"][: len(a["prompt_ids"])] == a["prompt_ids"]
    # Turn credit: veRL's output path writes the per-token layout into rm_scores; it sums to reward_score.
    d = out.as_dict()
    rm = d["rm_scores"]
    assert rm.shape == d["response_mask"].shape
    assert float(rm.sum()) == pytest.approx(out.reward_score, abs=1e-5)
    assert float(rm[-1]) == pytest.approx(1.0 + out.extra_fields["turn_scores"][-1], abs=1e-5)
    assert len(out.extra_fields["turn_scores"]) == len(completions)


async def test_wrong_action_scores_zero(verl_config, monkeypatch):
    _, completions = gold_completions("11", corrupt=True)
    out, _, _ = await run_loop(verl_config, monkeypatch, completions)
    assert out.extra_fields["reward_extra_info"]["outcome"] == 0.0
    assert out.reward_score == pytest.approx(0.3 * out.extra_fields["reward_extra_info"]["process"])


async def test_hallucinated_and_broken_calls_are_counted(verl_config, monkeypatch):
    completions = [
        'Looking it up now.\n<tool_call>\n{"name": "update_user_payment_methods", "arguments": {"x": 1}}\n</tool_call><|im_end|>',
        "Trying again.\n<tool_call>\n{\"name\": \"get_user_details\", \"arguments\": {\"user_id\": \n</tool_call><|im_end|>",
        "Sorry, I could not do it.<|im_end|>",
    ]
    out, _, _ = await run_loop(verl_config, monkeypatch, completions)
    info = out.extra_fields["reward_extra_info"]
    assert info["num_unknown_tool_calls"] == 1 and info["num_unparsed_tool_calls"] == 1


async def test_estimator_receives_turn_layout(verl_config, monkeypatch):
    """Two rollouts of the same task through the loop, then the registered estimator on their rm_scores."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    rows = []
    for corrupt in (False, True):
        _, completions = gold_completions("11", corrupt=corrupt)
        out, _, _ = await run_loop(verl_config, monkeypatch, completions)
        d = out.as_dict()
        rows.append((d["rm_scores"], d["response_mask"]))
    T = max(r.shape[0] for r, _ in rows)
    rewards = torch.zeros(2, T)
    mask = torch.zeros(2, T, dtype=torch.long)
    for i, (r, m) in enumerate(rows):
        rewards[i, : r.shape[0]] = r
        mask[i, : m.shape[0]] = m
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": True, "longhaul": {
        "alpha": 1.05, "discount_unit": "turn", "length_exponent": 0.5, "seed_compat": False, "credit": "turn",
        "process_weight": 0.3}})
    adv, _ = get_adv_estimator_fn("longhaul_grpo")(token_level_rewards=rewards, response_mask=mask,
                                                   index=["t11", "t11"], config=cfg)
    assert torch.isfinite(adv).all()
    assert (adv[0][mask[0].bool()] > 0).all() and (adv[1][mask[1].bool()] < 0).all()


def test_rendered_yaml_matches_spec(verl_config):
    from longhaul.agentloop.config import AGENT_LOOP_NAME, AGENT_LOOP_TARGET

    cfg, path = verl_config
    [entry] = yaml.safe_load(path.read_text())
    assert entry["name"] == AGENT_LOOP_NAME and entry["_target_"] == AGENT_LOOP_TARGET
    assert entry["limits"]["max_turns"] == 12 and entry["reward"]["credit"] == "turn"
    assert cfg.actor_rollout_ref.rollout.response_length == 100000
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(path)


def test_tool_config_loads_in_verl(tmp_path):
    """The rendered tool config loads through veRL's own registry; executing a tool outside the loop fails loudly."""
    import asyncio

    from verl.tools.tool_registry import initialize_tools_from_config

    from longhaul.agentloop.config import render_tool_config_yaml
    from longhaul.envs.runner import tool_schemas
    from longhaul.spec.load import parse_spec_text

    path = tmp_path / "tools.yaml"
    path.write_text(render_tool_config_yaml(parse_spec_text(SPEC_YAML)))
    tools = initialize_tools_from_config(str(path))
    assert sorted(t.name for t in tools) == sorted(s["function"]["name"] for s in tool_schemas())
    with pytest.raises(RuntimeError, match="longhaul_airline"):
        asyncio.run(tools[0].execute("x", {}))


async def test_long_prompt_ends_as_context_overflow_not_truncated(verl_config, monkeypatch):
    """veRL would left-truncate a long prompt (dropping the policy text); the loop ends the episode instead."""
    tok = make_tokenizer()
    server = ScriptedServer(tok, gold_completions("11")[1])
    loop, _ = build_loop(verl_config, server, monkeypatch)
    loop.prompt_length = 1000
    out = await loop.run({"temperature": 1.0}, **ROW)
    assert out.extra_fields["termination"] == "context_overflow" and server.calls == []
    assert out.extra_fields["reward_extra_info"]["outcome"] == 0.0 and out.extra_fields["reward_extra_info"]["aborted"] == 1.0
    d = out.as_dict()
    assert d["prompts"].shape[0] == 1000 and d["response_mask"].tolist() == [0]


async def test_user_stops_before_first_turn(verl_config, monkeypatch):
    tok = make_tokenizer()
    server = ScriptedServer(tok, [])
    loop, _ = build_loop(verl_config, server, monkeypatch, user=ScriptedUser(opening="Never mind. ###STOP###"))
    out = await loop.run({"temperature": 1.0}, **ROW)
    assert server.calls == [] and out.extra_fields["termination"] == "user_stop"
    assert len(out.prompt_ids) > 0 and out.response_mask == [0]
    assert out.as_dict()["rm_scores"].shape == (1,)
