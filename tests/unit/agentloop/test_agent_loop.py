"""The longhaul agent loop inside real veRL 0.9.1 on CPU.

veRL's own config (Hydra compose of ppo_trainer with the rendered overrides), veRL's own instantiation of the
rendered `agent_loop_config_path` entry, veRL's continuous-token builder and output path, and (for the batch
contract) veRL's own v1 agent-loop worker code over an in-memory TransferQueue (`conftest.FakeTQ`); only the LLM
server manager is a scripted token-level stand-in (it replays a task's gold actions as Hermes tool calls) and the
user simulator is scripted or served by the loopback OpenAI stub.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import numpy as np
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
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
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
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<tool_call>", "</tool_call>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


class ScriptedServer:
    """Stand-in for veRL's LLM server manager: returns scripted completions as token ids with log-probs, and the
    `extra_fields` veRL's server client attaches (`versions`: the weights version reported per call)."""

    def __init__(self, tokenizer, completions, *, versions=None, delay=0.0):
        self.tokenizer = tokenizer
        self.completions = list(completions)
        self.versions = list(versions) if versions is not None else None
        self.delay = delay
        self.calls = []

    async def generate(self, *, request_id, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        if self.delay:
            await asyncio.sleep(self.delay)
        text = self.completions.pop(0) if self.completions else "Goodbye.<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        extra = {}
        if self.versions is not None:
            v = self.versions.pop(0) if len(self.versions) > 1 else self.versions[0]
            # what LLMServerClient.generate returns: the server's version, min/max defaulted to it; a (first, last)
            # pair is what FullyAsyncLLMServerClient returns for a generation aborted at a weight update and
            # resumed with the new weights (the async trainers' partial rollouts)
            lo, hi = v if isinstance(v, tuple) else (v, v)
            extra = {"global_steps": hi, "min_global_steps": lo, "max_global_steps": hi, "num_cached_tokens": 7}
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields=extra)


class ScriptedUser:
    def __init__(self, opening="Hi, I need to change my reservation."):
        self.opening = opening
        self.calls = 0
        self.seeds = []

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

    from longhaul.agentloop.config import render_agent_loop_yaml
    from longhaul.layout import AGENT_LOOP_FILE, Paths
    from longhaul.render.verl import render_verl_overrides
    from longhaul.spec.load import parse_spec_text

    exp = parse_spec_text(SPEC_YAML)
    paths = Paths.under(str(tmp_path_factory.mktemp("loop")))
    path = Path(paths.config_dir) / AGENT_LOOP_FILE
    path.parent.mkdir(parents=True)
    path.write_text(render_agent_loop_yaml(exp))
    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        # The production override list, exactly as the renderer emits it.
        cfg = compose("ppo_trainer", overrides=render_verl_overrides(exp, paths))
    return cfg, path


def build_loop(verl_config, server, monkeypatch, user=None, *, real_user=False):
    """The loop as veRL instantiates it; the user simulator is `user` (scripted) unless `real_user`."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop

    cfg, path = verl_config
    entries = OmegaConf.load(path)
    entry = next(e for e in entries if e.name == cfg.actor_rollout_ref.rollout.agent.default_agent_loop)
    user = user or ScriptedUser()

    def make_user(self, row, seed=None):  # (before issue #13 the factory took only the row)
        user.seeds.append(seed)
        return user

    if not real_user:
        monkeypatch.setattr(LonghaulAirlineAgentLoop, "make_user_simulator", make_user)
    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=server,
        tokenizer=server.tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
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
    # The layout the estimator decodes (longhaul.rewards.combine): the outcome on the last response position,
    # turn k's process share on the first token of assistant turn k.
    from longhaul.rewards.combine import turn_start_positions

    shares = out.extra_fields["turn_scores"]
    assert len(shares) == len(completions)
    assert float(rm[-1]) == pytest.approx(1.0, abs=1e-5)  # the task was solved: outcome 1
    starts = turn_start_positions(out.response_mask)
    assert len(starts) == len(shares)
    for k, start in enumerate(starts):
        assert float(rm[start]) == pytest.approx(shares[k], abs=1e-5)


async def test_wrong_action_scores_zero(verl_config, monkeypatch):
    _, completions = gold_completions("11", corrupt=True)
    out, _, _ = await run_loop(verl_config, monkeypatch, completions)
    assert out.extra_fields["reward_extra_info"]["outcome"] == 0.0
    assert out.reward_score == pytest.approx(0.3 * out.extra_fields["reward_extra_info"]["process"])


async def test_hallucinated_and_broken_calls_are_counted(verl_config, monkeypatch):
    completions = [
        'Looking it up now.\n<tool_call>\n{"name": "update_user_payment_methods", "arguments": {"x": 1}}\n</tool_call><|im_end|>',  # noqa: E501 - a string literal kept whole
        'Trying again.\n<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": \n</tool_call><|im_end|>',
        "Sorry, I could not do it.<|im_end|>",
    ]
    out, _, _ = await run_loop(verl_config, monkeypatch, completions)
    info = out.extra_fields["reward_extra_info"]
    assert info["num_unknown_tool_calls"] == 1 and info["num_unparsed_tool_calls"] == 1


async def test_tool_error_limit_ends_the_trajectory_like_evaluation(verl_config, monkeypatch):
    """τ²'s `too_many_errors` inside a veRL rollout: the runner ends the episode after the turn that brings the tool
    errors to spec.environment.max_tool_errors (τ²'s 10 by default): no further generation, the user is not asked
    again, the trajectory is graded once as premature (outcome 0) and trains with its process score."""
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.spec.environment import TAU2_MAX_ERRORS

    cfg, path = verl_config
    [entry] = yaml.safe_load(path.read_text())
    assert entry["limits"]["max_tool_errors"] == TAU2_MAX_ERRORS
    bad = [
        '<tool_call>\n{"name": "get_reservation_details", "arguments": {"reservation_id": "ZZZZZZ"}}\n</tool_call>',
        '<tool_call>\n{"name": "update_user_profile", "arguments": {"user_id": "x"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": \n</tool_call>',
    ]
    errors = [f"Checking.\n{bad[i % 3]}<|im_end|>" for i in range(TAU2_MAX_ERRORS)]
    _, gold = gold_completions("11")  # would score 1 after the errors, but the episode has ended
    tok = make_tokenizer()
    server = ScriptedServer(tok, [*errors, *gold])
    loop, user = build_loop(verl_config, server, monkeypatch)
    assert loop.limits == EpisodeLimits(**entry["limits"]) and loop.limits.max_tool_errors == TAU2_MAX_ERRORS
    graded = []
    real_make_env = loop.make_env

    def make_env():
        graded.append(real_make_env())
        return graded[-1]

    monkeypatch.setattr(loop, "make_env", make_env)
    out = await loop.run({"temperature": 1.0}, **ROW)
    info = out.extra_fields["reward_extra_info"]
    assert out.extra_fields["termination"] == "too_many_errors"
    assert len(server.calls) == TAU2_MAX_ERRORS and user.calls == 1
    assert info["num_tool_errors"] == TAU2_MAX_ERRORS and info["aborted"] == 1.0 and info["outcome"] == 0.0
    assert out.reward_score == pytest.approx(0.3 * info["process"])
    assert graded[0].grade_computations == 1 and graded[0].termination == "too_many_errors"


def test_loop_settings_carry_the_runners_limits():
    """The agent loop gets the episode runner's own limits (one list, `EpisodeLimits.from_spec`), null included."""
    from longhaul.agentloop.config import build_loop_settings
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.spec.load import parse_spec_text

    for setting, want in (("", 10), ("max_tool_errors: 3, ", 3), ("max_tool_errors: null, ", None)):
        exp = parse_spec_text(SPEC_YAML.replace("environment: {", "environment: {" + setting))
        limits = build_loop_settings(exp)["limits"]
        assert EpisodeLimits(**limits) == EpisodeLimits.from_spec(exp) and limits["max_tool_errors"] == want


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
    cfg = OmegaConf.create(
        {
            "norm_adv_by_std_in_grpo": True,
            "longhaul": {
                "alpha": 1.05,
                "discount_unit": "turn",
                "length_exponent": 0.5,
                "seed_compat": False,
                "credit": "turn",
                "process_weight": 0.3,
            },
        }
    )
    adv, _ = get_adv_estimator_fn("longhaul_grpo")(
        token_level_rewards=rewards, response_mask=mask, index=["t11", "t11"], config=cfg
    )
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
    from longhaul.envs.prompt import tool_schemas
    from longhaul.spec.load import parse_spec_text

    path = tmp_path / "tools.yaml"
    path.write_text(render_tool_config_yaml(parse_spec_text(SPEC_YAML)))
    tools = initialize_tools_from_config(str(path))
    assert sorted(t.name for t in tools) == sorted(s["function"]["name"] for s in tool_schemas())
    with pytest.raises(RuntimeError, match="longhaul_airline"):
        asyncio.run(tools[0].execute("x", {}))


async def test_prompt_over_budget_fails_the_trajectory_instead_of_truncating(verl_config, monkeypatch, tmp_path):
    """veRL would left-truncate a long prompt (dropping the policy text); the loop fails the trajectory (its group
    is dropped and refilled) instead of training on it as a zero-reward sample."""
    from longhaul.agentloop.loop import TrajectoryFailed

    tok = make_tokenizer()
    server = ScriptedServer(tok, gold_completions("11")[1])
    loop, _ = build_loop(verl_config, server, monkeypatch)
    loop.prompt_length = 1000
    monkeypatch.setenv("LONGHAUL_ROLLOUT_DIR", str(tmp_path))
    with pytest.raises(TrajectoryFailed, match="prompt_over_budget.*rollout.prompt_length is 1000") as info:
        await loop.run({"temperature": 1.0}, **ROW)
    assert info.value.reason == "prompt_over_budget" and server.calls == []
    # ROW has no step (veRL's v0 worker passes none): the trace lands under step_unknown/
    [failure] = [json.loads(p.read_text()) for p in (tmp_path / "step_unknown" / "failures").glob("*.jsonl")]
    assert failure["trajectory"] is None and failure["failed"] == "prompt_over_budget"
    assert failure["failed_trajectory"]["termination"] == "context_overflow"


async def test_user_stops_before_first_turn(verl_config, monkeypatch):
    tok = make_tokenizer()
    server = ScriptedServer(tok, [])
    loop, _ = build_loop(verl_config, server, monkeypatch, user=ScriptedUser(opening="Never mind. ###STOP###"))
    out = await loop.run({"temperature": 1.0}, **ROW)
    assert server.calls == [] and out.extra_fields["termination"] == "user_stop"
    assert len(out.prompt_ids) > 0 and out.response_mask == [0]
    assert out.as_dict()["rm_scores"].shape == (1,)


# ---------------------------------------------------------------------------------------------------------------
# The contract with veRL's v1 trainer (issue #13): version tags, uniform fields, failures, seeds, timing, traces


def row(*, step=3, index=0, session=0, uid="g0", validate=False, task="11", seed=42):
    """A dataset row as veRL's v1 worker hands it to `run`: row fields plus global_steps, uid and session_id."""
    return {
        "raw_prompt": [{"role": "user", "content": "unused"}],
        "extra_info": {"task_id": task, "index": index, "seed": seed, "validate": validate},
        "index": index,
        "uid": uid,
        "session_id": session,
        "global_steps": step,
    }


def fast_retry():
    from longhaul.clients.openai_compat import RetryPolicy

    return RetryPolicy(attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=2.0)


def stub_user_settings(loop, stub):
    loop.user_settings = {**loop.user_settings, "base_url": stub.base_url, "model": "user"}


async def test_weights_version_tags_come_from_the_server(verl_config, monkeypatch):
    """veRL's server client tags every generation with the weights version; the output keeps the first call's
    fields and moves max_global_steps forward (as veRL's ToolAgentLoop does). Without them the v1 trainer's
    `_compute_metrics` fails on `np.array([None, ...], dtype=int)` at the end of step 1."""
    tok = make_tokenizer()
    _, completions = gold_completions("11")
    server = ScriptedServer(tok, completions, versions=[4, 5])
    loop, _ = build_loop(verl_config, server, monkeypatch)
    out = await loop.run({"temperature": 1.0}, **row(step=6))
    ef = out.extra_fields
    assert (ef["global_steps"], ef["min_global_steps"], ef["max_global_steps"]) == (4, 4, 5)
    assert ef["num_cached_tokens"] == 7


async def test_each_turn_records_the_policy_versions_it_was_generated_with(verl_config, monkeypatch, tmp_path):
    """Under an asynchronous trainer a turn can be aborted at a weight update and resumed with the new weights:
    the trace records each turn's (first, last) version, `longhaul explain` shows it, and the trajectory's span
    (veRL's min/max_global_steps) covers every turn."""
    from typer.testing import CliRunner

    from longhaul.agentloop.traces import ROLLOUT_DIR_ENV
    from longhaul.cli import app

    monkeypatch.setenv(ROLLOUT_DIR_ENV, str(tmp_path))
    tok = make_tokenizer()
    _, completions = gold_completions("11")
    versions = [4, (4, 5)]  # task 11's gold conversation: two assistant turns
    server = ScriptedServer(tok, completions, versions=versions)
    loop, _ = build_loop(verl_config, server, monkeypatch)
    out = await loop.run({"temperature": 1.0}, **row(step=5))
    (record,) = [json.loads(line) for line in (tmp_path / "step_5" / f"{os.getpid()}.jsonl").open()]
    turns = record["trajectory"]["turns"]
    assert [t["policy_version"] for t in turns] == [[4, 4], [4, 5]]
    ef = out.extra_fields
    assert (ef["min_global_steps"], ef["max_global_steps"]) == (4, 5)
    shown = CliRunner().invoke(app, ["explain", str(tmp_path / "step_5")])
    assert shown.exit_code == 0, shown.output
    assert "policy versions 4…5" in shown.output and "turn 1 resumed across 4→5" in shown.output


async def test_every_output_has_the_same_fields(verl_config, monkeypatch):
    """TransferQueue returns only the fields every sample of a batch has: an output without a generation (the user
    stopped before the policy spoke) must still carry log-probs, integer version tags and the same extra keys."""
    tok = make_tokenizer()
    _, completions = gold_completions("11")
    normal, _ = build_loop(verl_config, ScriptedServer(tok, completions, versions=[2]), monkeypatch)
    out_normal = await normal.run({"temperature": 1.0}, **row(step=3))
    stop_user = ScriptedUser(opening="Never mind. ###STOP###")
    silent, _ = build_loop(verl_config, ScriptedServer(tok, [], versions=[2]), monkeypatch, user=stop_user)
    out_silent = await silent.run({"temperature": 1.0}, **row(step=3, session=1))
    d_normal, d_silent = out_normal.as_dict(), out_silent.as_dict()
    assert set(d_normal) == set(d_silent) and "rollout_log_probs" in d_silent
    for d in (d_normal, d_silent):
        assert d["rollout_log_probs"].shape == d["responses"].shape == d["response_mask"].shape
    assert set(out_normal.extra_fields) == set(out_silent.extra_fields)
    assert set(out_normal.extra_fields["reward_extra_info"]) == set(out_silent.extra_fields["reward_extra_info"])
    # no generation: the version step 3's rollouts run with (veRL's sync trainer: N-1), as integers
    assert [out_silent.extra_fields[k] for k in ("global_steps", "min_global_steps", "max_global_steps")] == [2, 2, 2]
    assert out_silent.extra_fields["num_cached_tokens"] == 0
    # ###STOP### before the first turn is a legitimate ending: graded, trains normally
    assert out_silent.extra_fields["termination"] == "user_stop" and out_silent.reward_score is not None
    val, _ = build_loop(verl_config, ScriptedServer(tok, []), monkeypatch, user=ScriptedUser(opening="###STOP###"))
    out_val = await val.run({"temperature": 0.0}, **row(step=3, validate=True))
    assert out_val.extra_fields["min_global_steps"] == out_val.extra_fields["max_global_steps"] == 3


def _verl_worker(verl_config, server, monkeypatch):
    """veRL's own v1 agent-loop worker object (the Ray actor's class), wired to the scripted server, without Ray."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from longhaul.agentloop.config import AGENT_LOOP_NAME

    cfg, path = verl_config
    entry = next(e for e in OmegaConf.load(path) if e.name == AGENT_LOOP_NAME)
    monkeypatch.setitem(_agent_loop_registry, AGENT_LOOP_NAME, entry)
    cls = AgentLoopWorkerTQ.__ray_actor_class__
    worker = cls.__new__(cls)
    worker.config, worker.llm_client, worker.tokenizer = cfg, server, server.tokenizer
    worker.processor = worker.hf_model_type = worker.dataset_cls = worker.reward_loop_worker_handles = None
    worker.tools, worker.distillation_enabled, worker.mm_processor_kwargs = [], False, {}
    return worker


async def _run_group(worker, tq, uid, *, n, step=3, index=0):
    from longhaul.agentloop.config import AGENT_LOOP_NAME

    tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "pending", "global_steps": step})
    prompt = {**row(step=step, index=index, uid=uid), "agent_name": AGENT_LOOP_NAME, "__rollout_n__": n}
    prompt.pop("session_id")
    trajectory = {"step": step, "sample_index": index, "rollout_n": 0, "validate": False}
    await worker._run_prompt(prompt, {"temperature": 1.0, "logprobs": True}, trajectory=trajectory)


async def test_groups_through_verls_worker_and_sampler(verl_config, monkeypatch, fake_tq, openai_stub):
    """veRL's v1 worker code runs the loop: a group whose first session ends before any generation stores the same
    fields as its sibling, with integer version tags; a group whose simulator fails (HTTP 5xx past the retries) in
    one session is marked failed, and the longhaul sampler drops it whole although a sibling finished."""
    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop

    tok = make_tokenizer()
    _, completions = gold_completions("11")
    worker = _verl_worker(verl_config, ScriptedServer(tok, completions, versions=[2]), monkeypatch)
    original = LonghaulAirlineAgentLoop.make_user_simulator
    openai_stub.set_script("user", lambda body: {"unused": True})  # never answered: every request fails
    monkeypatch.setattr(LonghaulAirlineAgentLoop, "user_retry", fast_retry(), raising=False)

    def make_user(self, r, seed=None):
        if r["uid"] == "down" and r["session_id"] == 1:
            stub_user_settings(self, openai_stub)
            return original(self, r, seed)
        return ScriptedUser(
            opening="Never mind. ###STOP###" if r["session_id"] == 0 else "Hi, I need to change my reservation."
        )

    monkeypatch.setattr(LonghaulAirlineAgentLoop, "make_user_simulator", make_user)
    await _run_group(worker, fake_tq, "ok", n=2)
    assert fake_tq.status("ok") == "finished"
    stored = {k: fake_tq.fields["train"][k] for k in ("ok_0_0", "ok_1_0")}
    assert set(stored["ok_0_0"]) == set(stored["ok_1_0"]) and "rollout_log_probs" in stored["ok_0_0"]
    tags = [fake_tq.tags["train"][k] for k in stored]
    # what the v1 trainer's _compute_metrics does with them
    assert np.array([t["min_global_steps"] for t in tags], dtype=int).tolist() == [2, 2]
    assert np.array([t["max_global_steps"] for t in tags], dtype=int).tolist() == [2, 2]

    openai_stub.fail_next(10, status=503)
    await _run_group(worker, fake_tq, "down", n=2, index=1)
    assert fake_tq.status("down") == "failure"
    assert set(fake_tq.trajectories()) == {"ok_0_0", "ok_1_0", "down_0_0"}  # the survivor is stored
    assert len(openai_stub.requests) == 3  # the simulator client's attempts

    from longhaul.agentloop.sampler import LonghaulReplayBuffer

    buffer = LonghaulReplayBuffer(
        trainer_mode="sync",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs={"rollout_n": 2},
        refill_fn=lambda k: pytest.fail("nothing to refill: 'ok' fills the batch"),
    )
    batch, metrics = buffer.sample(global_steps=3, partition_id="train", batch_size=1)
    assert sorted(batch.keys) == ["ok_0_0", "ok_1_0"]
    assert metrics["rollout/dropped_groups"] == 1 and metrics["rollout/failed_trajectories"] == 1
    assert "down" not in fake_tq.tags["train"] and "down_0_0" not in fake_tq.tags["train"]


async def test_simulator_down_after_retries_fails_the_trajectory(verl_config, monkeypatch, openai_stub, tmp_path):
    from longhaul.agentloop.loop import LonghaulAirlineAgentLoop, TrajectoryFailed
    from longhaul.agentloop.traces import ROLLOUT_DIR_ENV

    tok = make_tokenizer()
    server = ScriptedServer(tok, gold_completions("11")[1])
    loop, _ = build_loop(verl_config, server, monkeypatch, real_user=True)  # the real simulator, over the stub
    monkeypatch.setattr(LonghaulAirlineAgentLoop, "user_retry", fast_retry(), raising=False)
    monkeypatch.setenv(ROLLOUT_DIR_ENV, str(tmp_path))
    stub_user_settings(loop, openai_stub)
    openai_stub.set_script("user", lambda body: {"unused": True})
    openai_stub.fail_next(10, status=502)
    with pytest.raises(TrajectoryFailed, match="user_simulator_error.*failed after 3 attempts: HTTP 502") as info:
        await loop.run({"temperature": 1.0}, **row(step=5, session=1))
    assert info.value.reason == "user_simulator_error" and server.calls == []
    [failure] = [json.loads(line) for line in (tmp_path / "step_5" / "failures" / f"{os.getpid()}.jsonl").open()]
    assert failure["failed"] == "user_simulator_error" and failure["session"] == 1 and failure["trajectory"] is None
    assert not (tmp_path / "step_5" / f"{os.getpid()}.jsonl").exists()


async def test_policy_endpoint_error_fails_the_trajectory_never_trains(verl_config, monkeypatch, tmp_path):
    """An endpoint error of the policy (a backend that raises `PolicyEndpointError`) ends the episode
    `endpoint_error`; the loop fails the trajectory (its group is dropped) instead of training on a zero."""
    from longhaul.agentloop.loop import TrajectoryFailed
    from longhaul.envs.protocols import PolicyEndpointError

    class DownServer(ScriptedServer):
        async def generate(self, **kw):
            if len(self.calls) == 1:
                raise PolicyEndpointError("policy endpoint http://x/v1 failed after 3 attempts: HTTP 503")
            return await super().generate(**kw)

    server = DownServer(make_tokenizer(), gold_completions("11")[1])
    loop, _ = build_loop(verl_config, server, monkeypatch)
    monkeypatch.setenv("LONGHAUL_ROLLOUT_DIR", str(tmp_path))
    with pytest.raises(TrajectoryFailed, match="endpoint_error.*failed after 3 attempts: HTTP 503") as info:
        await loop.run({"temperature": 1.0}, **ROW)
    assert info.value.reason == "endpoint_error" and len(server.calls) == 1
    [failure] = [json.loads(p.read_text()) for p in (tmp_path / "step_unknown" / "failures").glob("*.jsonl")]
    assert failure["trajectory"] is None and failure["failed"] == "endpoint_error"
    assert failure["failed_trajectory"]["termination"] == "endpoint_error"
    assert failure["failed_trajectory"]["grade"] is None and len(failure["failed_trajectory"]["turns"]) == 1


async def test_seeds_differ_per_step_group_and_session_and_reach_the_simulator(verl_config, monkeypatch, openai_stub):
    from support.openai_stub import Reply

    tok = make_tokenizer()
    loop, _ = build_loop(verl_config, ScriptedServer(tok, []), monkeypatch, real_user=True)
    stub_user_settings(loop, openai_stub)
    openai_stub.set_script("user", lambda body: Reply(content="###STOP###"))
    keys = [
        (3, 0, 0, False),
        (3, 0, 1, False),
        (3, 1, 0, False),
        (4, 0, 0, False),
        (3, 0, 0, False),
        (3, 0, 0, True),
        (4, 0, 0, True),
    ]
    outs = [
        await loop.run({"temperature": 1.0}, **row(step=step, index=index, session=session, validate=validate))
        for step, index, session, validate in keys
    ]
    sent = [r["seed"] for r in openai_stub.requests]
    assert len(set(sent[:4])) == 4 and sent[4] == sent[0]  # distinct per (step, group, session); reproducible
    assert sent[5] == sent[6] and sent[5] not in sent[:5]  # validation: the same customers at every step
    assert [o.extra_fields["rollout_seed"] for o in outs] == sent  # the output records the seed the simulator got


async def test_generation_and_tool_time_is_measured(verl_config, monkeypatch):
    tok = make_tokenizer()
    task, completions = gold_completions("11")
    server = ScriptedServer(tok, completions, delay=0.02)
    loop, _ = build_loop(verl_config, server, monkeypatch)
    out = await loop.run({"temperature": 1.0}, **row())
    assert len(server.calls) == len(completions)
    assert out.metrics.generate_sequences >= 0.02 * len(completions)
    assert out.metrics.tool_calls > 0


async def test_traces_are_written_per_step_and_read_by_explain(verl_config, monkeypatch, tmp_path):
    from longhaul.agentloop.traces import ROLLOUT_DIR_ENV
    from longhaul.commands.explain import _load_trajectories
    from longhaul.envs.trajectory import Trajectory

    tok = make_tokenizer()
    _, completions = gold_completions("11")
    loop, _ = build_loop(verl_config, ScriptedServer(tok, list(completions)), monkeypatch)
    await loop.run({"temperature": 1.0}, **row(step=2))
    assert not any(tmp_path.iterdir())  # LONGHAUL_ROLLOUT_DIR unset: no traces
    monkeypatch.setenv(ROLLOUT_DIR_ENV, str(tmp_path))
    outs = {}
    for key, validate, session in (("train", False, 0), ("train", False, 1), ("val", True, 0)):
        loop, _ = build_loop(verl_config, ScriptedServer(tok, list(completions), versions=[2]), monkeypatch)
        outs[key, session] = await loop.run({"temperature": 1.0}, **row(step=3, session=session, validate=validate))
    pid = os.getpid()
    train_file, val_file = tmp_path / "step_3" / f"{pid}.jsonl", tmp_path / "val_step_3" / f"{pid}.jsonl"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl")) == [
        f"step_3/{pid}.jsonl",
        f"val_step_3/{pid}.jsonl",
    ]
    records = [json.loads(line) for line in train_file.open()]
    assert [r["session"] for r in records] == [0, 1]
    for r in records:
        out = outs["train", r["session"]]
        assert (r["step"], r["uid"], r["validate"]) == (3, "g0", False)
        assert r["seed"] == out.extra_fields["rollout_seed"] == r["trajectory"]["seed"]
        assert r["reward"]["score"] == pytest.approx(out.reward_score) and r["reward"]["outcome"] == 1.0
        assert r["timing"]["generate_sequences"] >= 0 and r["weights_version"]["max_global_steps"] == 2
    # `longhaul explain` reads the file as it is; the trajectory is the runner's record
    loaded = _load_trajectories(train_file)
    loaded = loaded[0] if isinstance(loaded, tuple) else loaded  # (trajectories, group keys, skipped) lately
    trajs = [Trajectory.from_dict(t) for t in loaded]
    assert [t.task_id for t in trajs] == ["11", "11"] and trajs[0].outcome == 1.0
    assert json.loads(val_file.read_text())["validate"] is True
    # a trace that cannot be written is skipped, never a failed trajectory (its group would be dropped)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(ROLLOUT_DIR_ENV, str(blocker))
    loop, _ = build_loop(verl_config, ScriptedServer(tok, list(completions)), monkeypatch)
    assert (await loop.run({"temperature": 1.0}, **row(step=4))).reward_score is not None


async def test_user_simulators_share_one_client_per_event_loop(verl_config, monkeypatch):
    """Building a client per trajectory (32 connection pools) blocked the worker's event loop for ~2 s each."""
    tok = make_tokenizer()
    loop, _ = build_loop(verl_config, ScriptedServer(tok, []), monkeypatch, real_user=True)
    other, _ = build_loop(verl_config, ScriptedServer(tok, []), monkeypatch, real_user=True)
    a = loop.make_user_simulator(row(session=0), 1)
    b = other.make_user_simulator(row(session=1), 2)
    assert a.client is b.client and (a.seed, b.seed) == (1, 2)
