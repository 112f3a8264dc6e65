"""The tiny models as an in-process chat endpoint (`longhaul.tiny.local_chat`), on the project's own build: its
answers pass the real client's response check and parse into the turns the runner takes, greedy answers equal the
build's own checks' generations, sampling is seeded, and the demo's step-0 evaluation runs on it end to end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from longhaul.clients.openai_compat import EndpointError, check_completion
from longhaul.clients.policy import parse_chat_response
from longhaul.envs.airline.tasks import get_task, policy_text
from longhaul.envs.prompt import build_initial_messages, tool_schemas
from longhaul.spec import parse_spec_text
from longhaul.tiny.checks import complete
from longhaul.tiny.gold import first_user_message
from longhaul.tiny.inputs import default_date_line
from longhaul.tiny.local_chat import LocalChat, step0_estimate

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def build():
    from longhaul.tiny.build import ensure_tiny_models

    return ensure_tiny_models(log=lambda _: None)


@pytest.fixture(scope="module")
def policy(build) -> LocalChat:
    return LocalChat.load(build.policy_dir, "policy")


def _first_turn(task_id: str) -> list[dict]:
    return build_initial_messages(policy_text(), default_date_line(), first_user_message(get_task(task_id).raw))


def test_greedy_answers_are_the_builds_own_generations_and_parse_into_turns(policy):
    tools = tool_schemas()
    for tid in ("0", "5"):
        messages = _first_turn(tid)
        data = asyncio.run(policy.chat(messages, tools=tools, temperature=0, max_tokens=96))
        check_completion(data)  # raises unless the real client would take it
        text = data["choices"][0]["message"]["content"]
        built = complete(policy.model, policy.tokenizer, messages, tools, sample=False, max_new_tokens=96)
        assert built.removesuffix("<|im_end|>") == text
        turn = parse_chat_response(data)
        assert ("<tool_call>" in text) == bool(turn.tool_calls), text
        assert turn.completion_tokens == data["usage"]["completion_tokens"] > 0
        assert data["choices"][0]["finish_reason"] in {"stop", "length"}


def test_the_system_turn_is_encoded_once_and_reused(policy, monkeypatch):
    """The policy's ~4.4k-token system turn (policy text and tool schemas) is encoded once for every turn and task
    that opens with it; another system turn gets its own; a conversation without one is answered uncached."""
    from longhaul.tiny import local_chat

    encoded: list[int] = []

    class Counting(local_chat.PrefixCache):
        def __init__(self, model, prefix_ids):
            encoded.append(len(prefix_ids))
            super().__init__(model, prefix_ids)

    monkeypatch.setattr(local_chat, "PrefixCache", Counting)
    chat, tools = LocalChat(policy.model, policy.tokenizer, "policy", "test"), tool_schemas()
    for tid in ("0", "5", "0"):
        asyncio.run(chat.chat(_first_turn(tid), tools=tools, temperature=0, max_tokens=4))
    assert len(encoded) == 1 and encoded[0] > 4000, encoded
    other = [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "Hello."}]
    asyncio.run(chat.chat(other, temperature=0, max_tokens=4))
    asyncio.run(chat.chat(other[1:], temperature=0, max_tokens=4))
    assert len(encoded) == 2 and encoded[1] < 50, encoded


def test_sampling_is_seeded(policy):
    messages, tools = _first_turn("1"), tool_schemas()

    def sample(seed: int) -> str:
        data = asyncio.run(policy.chat(messages, tools=tools, temperature=1.0, top_p=1.0, max_tokens=16, seed=seed))
        return data["choices"][0]["message"]["content"]

    assert sample(3) == sample(3)
    assert len({sample(s) for s in range(4)}) > 1


def test_an_empty_required_text_is_an_endpoint_error(policy, monkeypatch):
    """A turn that ends at once: text is optional for the policy, required of the simulator (as the client)."""
    import torch

    monkeypatch.setattr(
        policy.model, "generate", lambda ids, **_: torch.cat([ids, torch.tensor([[policy.stop_id]])], 1)
    )
    data = asyncio.run(policy.chat(_first_turn("1"), max_tokens=8))
    assert data["choices"][0]["message"]["content"] == "" and data["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(EndpointError, match="answered without text"):
        asyncio.run(policy.chat(_first_turn("1"), max_tokens=8, expect_text=True))


def test_the_demos_step0_evaluation_runs_in_process(build, policy):
    doc = yaml.safe_load((ROOT / "specs" / "demo.yaml").read_text())
    doc["spec"]["environment"].update(
        split={"preset": "explicit", "train": [0], "test": [2]}, max_turns=3, max_tokens_per_turn=32
    )
    doc["spec"]["evaluation"].update(samples_per_task=2, k=[1, 2])
    spec = parse_spec_text(yaml.safe_dump(doc), file="demo.yaml")
    user = LocalChat.load(build.user_dir, "user")
    first = step0_estimate(spec, policy, user)
    assert first["c_over_n"].endswith("/2") and sum(first["terminations"].values()) == 2
    assert first["train_pass1"] == int(first["c_over_n"].split("/")[0]) / 2
    assert step0_estimate(spec, policy, user) == first  # seeded per episode, like the demo's
