"""OpenAI-compatible clients against the scripted loopback server: retries, clear failures, Hermes parsing."""

from __future__ import annotations

import json
import re

import pytest

from longhaul.clients.openai_compat import ChatClient, EndpointError, RetryPolicy
from longhaul.clients.policy import OpenAIPolicy, parse_arguments, parse_chat_response
from longhaul.clients.user_simulator import AGENT_GREETING, OpenAIUserSimulator, build_user_messages
from longhaul.envs.airline.env import AirlineEnv
from longhaul.envs.airline.tasks import get_task
from longhaul.envs.hermes import parse_hermes
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.prompt import tool_schemas
from longhaul.envs.protocols import ContextOverflowError
from longhaul.envs.runner import run_episode
from support.net import free_port
from support.openai_stub import Reply

FAST = RetryPolicy(attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=2.0)


def hello(_body):
    return Reply(content="hello")


async def test_retries_5xx_then_succeeds(openai_stub):
    openai_stub.set_script("m", hello)
    openai_stub.fail_next(2, status=503)
    async with ChatClient(openai_stub.base_url, "m", retry=FAST) as c:
        data = await c.chat([{"role": "user", "content": "hi"}], max_tokens=5)
    assert data["choices"][0]["message"]["content"] == "hello"
    assert c.requests_sent == 3 and c.retries == 2


async def test_failure_surviving_retries_raises_a_clear_error(openai_stub):
    openai_stub.set_script("m", hello)
    openai_stub.fail_next(10, status=500)
    async with ChatClient(openai_stub.base_url, "m", retry=FAST, role="user simulator") as c:
        with pytest.raises(EndpointError, match=r"user simulator endpoint .* failed after 3 attempts: HTTP 500"):
            await c.chat([{"role": "user", "content": "hi"}])
    assert c.requests_sent == 3


async def test_timeouts_are_retried(openai_stub):
    openai_stub.set_script("m", hello)
    openai_stub.hang_next(1, seconds=1.0)
    retry = RetryPolicy(attempts=3, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=0.3)
    async with ChatClient(openai_stub.base_url, "m", retry=retry) as c:
        data = await c.chat([{"role": "user", "content": "hi"}])
    assert data["choices"][0]["message"]["content"] == "hello" and c.retries == 1


async def test_unknown_model_fails_at_once(openai_stub):
    async with ChatClient(openai_stub.base_url, "missing", retry=FAST) as c:
        with pytest.raises(EndpointError, match="HTTP 404"):
            await c.chat([{"role": "user", "content": "hi"}])
    assert c.requests_sent == 1


async def test_unreachable_endpoint_raises_after_retries():
    port = free_port()
    async with ChatClient(f"http://127.0.0.1:{port}/v1", "m", retry=FAST) as c:
        with pytest.raises(EndpointError, match="connection error"):
            await c.chat([{"role": "user", "content": "hi"}])


async def test_context_overflow_is_its_own_error(openai_stub):
    openai_stub.set_script(
        "m", lambda b: Reply(status=400, error="This model's maximum context length is 4096 tokens.")
    )
    async with ChatClient(openai_stub.base_url, "m", retry=FAST) as c:
        with pytest.raises(ContextOverflowError):
            await c.chat([{"role": "user", "content": "hi"}])


async def test_policy_sends_tools_sampling_seed_and_parses_tool_calls(openai_stub):
    openai_stub.set_script(
        "p",
        lambda b: Reply(
            tool_calls=[("get_user_details", {"user_id": "a_b_1"})], completion_tokens=17, prompt_tokens=900
        ),
    )
    async with ChatClient(openai_stub.base_url, "p", retry=FAST) as c:
        turn = await OpenAIPolicy(c).with_seed(42).next_turn([{"role": "user", "content": "x"}], tool_schemas(), 256)
    body = openai_stub.requests[-1]
    assert body["seed"] == 42 and body["max_tokens"] == 256 and body["tool_choice"] == "auto"
    assert len(body["tools"]) == 14 and body["temperature"] == 0.7
    call = turn.tool_calls[0]
    assert (call.name, call.arguments, call.parse_error) == ("get_user_details", {"user_id": "a_b_1"}, None)
    assert call.call_id and turn.completion_tokens == 17 and turn.prompt_tokens == 900


def test_argument_parsing():
    assert parse_arguments('{"a": 1}') == ({"a": 1}, '{"a": 1}', None)
    assert parse_arguments("") == ({}, "", None)
    assert parse_arguments({"a": 1})[0] == {"a": 1}
    args, raw, err = parse_arguments('{"a": ')
    assert args is None and raw == '{"a": ' and "invalid JSON" in err
    assert "must be a JSON object" in parse_arguments("[1, 2]")[2]


def test_hermes_blocks_in_content():
    text, calls = parse_hermes(
        'Checking.\n<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "a_b_1"}}\n</tool_call>'
    )
    assert text == "Checking." and calls[0].name == "get_user_details" and calls[0].arguments == {"user_id": "a_b_1"}
    # A block cut off by the token limit stays text (a message to the user), as in training and as vLLM reads it.
    cut = '<tool_call>{"name": "cancel_reservation", "arguments": {"reservation_id": '
    assert parse_hermes(cut) == (cut.strip(), [])
    # A closed block that is not a call is an error call (never dropped); an unclosed one that parses is a call.
    text, calls = parse_hermes('<tool_call>{"name": "calculate", "arguments": [1]}</tool_call>')
    assert text == "" and calls[0].name == "calculate" and calls[0].arguments is None and calls[0].parse_error
    text, calls = parse_hermes('Hm.<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}')
    assert text == "Hm." and calls[0].arguments == {"expression": "1+1"} and calls[0].parse_error is None
    turn = parse_chat_response(
        {
            "choices": [
                {
                    "message": {
                        "content": None,
                        "tool_calls": [{"id": "c1", "function": {"name": "calculate", "arguments": "{bad"}}],
                    },
                    "finish_reason": "tool_calls",
                }
            ]
        }
    )
    assert turn.tool_calls[0].parse_error and turn.content == "" and turn.finish_reason == "tool_calls"


def test_user_simulator_roles_are_flipped():
    msgs = build_user_messages(
        "Reason for call: test",
        [
            {"role": "user", "content": "I need help"},
            {"role": "assistant", "content": "Sure, what is your id?"},
        ],
    )
    assert msgs[0]["role"] == "system" and "Reason for call: test" in msgs[0]["content"]
    assert msgs[1] == {"role": "user", "content": AGENT_GREETING}
    assert [m["role"] for m in msgs[2:]] == ["assistant", "user"]


async def test_episode_ends_unscored_when_the_policy_endpoint_stays_down(openai_stub):
    """A dead endpoint ends the episode as `endpoint_error`, ungraded and unscored: never a zero-reward trajectory."""
    openai_stub.set_script("user", lambda b: Reply(content="Hi, I need help."))

    def down(_body):
        raise ConnectionError("backend crashed")

    openai_stub.set_script("policy", down)  # the stub answers 500 for every policy request
    async with (
        ChatClient(openai_stub.base_url, "policy", retry=FAST) as pc,
        ChatClient(openai_stub.base_url, "user", retry=FAST) as uc,
    ):
        traj = await run_episode(AirlineEnv, get_task("0"), OpenAIPolicy(pc), OpenAIUserSimulator(uc), EpisodeLimits())
    assert traj.termination == "endpoint_error" and traj.grade is None and not traj.scored and traj.outcome == 0.0
    assert re.search("policy endpoint .* failed after 3 attempts: HTTP 500", traj.metadata["endpoint_error"])
    assert traj.metadata["endpoint_fault"] == "http_5xx"
    # what was said before the failure is kept: the system prompt and the customer's opening line
    assert [m["role"] for m in traj.messages] == ["system", "user"] and traj.turns == []


async def test_malformed_tool_json_over_http_is_an_observed_error(openai_stub):
    turns = iter(
        [
            Reply(tool_calls=[("get_user_details", '{"user_id": ')]),
            Reply(
                content='<tool_call>{"name": "get_user_details", "arguments": {"user_id": "emma_kim_9957"}}</tool_call>'
            ),
            Reply(content="All set. ###STOP###"),
        ]
    )
    openai_stub.set_script("policy", lambda b: next(turns))
    openai_stub.set_script("user", lambda b: Reply(content="Hello"))
    async with (
        ChatClient(openai_stub.base_url, "policy", retry=FAST) as pc,
        ChatClient(openai_stub.base_url, "user", retry=FAST) as uc,
    ):
        traj = await run_episode(AirlineEnv, get_task("0"), OpenAIPolicy(pc), OpenAIUserSimulator(uc), EpisodeLimits())
    bad, good = traj.turns[0].tool_calls[0], traj.turns[1].tool_calls[0]
    assert bad.is_error and bad.parse_error and bad.result.startswith("Error:")
    assert not good.is_error and json.loads(good.result)["user_id"] == "emma_kim_9957"
    assert traj.outcome == 1.0 and traj.termination == "agent_stop"
    # the transcript sent back to the server carries the tool results in OpenAI format
    sent = openai_stub.requests[-1]["messages"]
    assert sent[2]["tool_calls"][0]["function"]["arguments"] == '{"user_id": '
    assert sent[3]["role"] == "tool" and sent[3]["content"].startswith("Error:")


def test_shared_client_is_one_per_event_loop_and_endpoint(openai_stub):
    """Code that runs many episodes on one event loop (veRL's agent-loop worker) shares one client per endpoint;
    its pools are bound to that loop, so another loop gets its own."""
    import asyncio

    from longhaul.clients.openai_compat import shared_chat_client

    openai_stub.set_script("m", hello)

    async def episodes():
        a = shared_chat_client(openai_stub.base_url, "m", retry=FAST, role="user simulator")
        b = shared_chat_client(openai_stub.base_url + "/", "m", retry=FAST, role="user simulator")
        other_model = shared_chat_client(openai_stub.base_url, "n", retry=FAST, role="user simulator")
        await a.chat([{"role": "user", "content": "hi"}])
        await b.chat([{"role": "user", "content": "hi"}])
        return a, b, other_model

    a, b, other_model = asyncio.run(episodes())
    assert a is b and other_model is not a and a.requests_sent == 2
    again, _, _ = asyncio.run(episodes())
    assert again is not a and again.requests_sent == 2
    with pytest.raises(RuntimeError, match="no running event loop"):
        shared_chat_client(openai_stub.base_url, "m")


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ([], "malformed_response"),
        ({"choices": None}, "malformed_response"),
        ({"choices": []}, "empty_choices"),
        ({"choices": ["text"]}, "malformed_response"),
        ({"choices": [{"message": None}]}, "malformed_response"),
        ({"choices": [{"message": {"content": 3}}]}, "malformed_response"),
        ({"choices": [{"message": {"tool_calls": "f(x)"}}]}, "malformed_response"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]}, "malformed_response"),
        (
            {"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": 3}}]}}]},
            "malformed_response",
        ),
        ({"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": "many"}}, "malformed_response"),
    ],
)
def test_answers_that_are_not_chat_completions_are_classified(body, kind):
    from longhaul.clients.openai_compat import _Retryable, check_completion

    with pytest.raises(_Retryable) as info:
        check_completion(body)
    assert info.value.kind == kind


def test_a_usable_completion_passes_and_empty_text_is_a_fault_only_when_text_is_expected():
    from longhaul.clients.openai_compat import _Retryable, check_completion

    ok = {
        "choices": [{"message": {"content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    check_completion(ok)  # invalid JSON arguments are the policy's output, judged by the runner
    with pytest.raises(_Retryable, match="no text") as info:
        check_completion(ok, expect_text=True)
    assert info.value.kind == "empty_reply"


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("null_message", "malformed_response"),
        ("non_utf8", "non_utf8"),
        ("truncated_json", "invalid_json"),
        ("reset", "connection_reset"),
    ],
)
async def test_persistent_faults_raise_endpoint_errors_with_their_kind(openai_stub, fault, kind):
    openai_stub.set_script("m", hello)
    openai_stub.inject(fault, FAST.attempts)
    async with ChatClient(openai_stub.base_url, "m", retry=FAST, role="user simulator") as c:
        with pytest.raises(EndpointError, match=f"failed after 3 attempts: .*\\(fault: {kind}\\)") as info:
            await c.chat([{"role": "user", "content": "hi"}])
    assert (info.value.kind, info.value.role, info.value.attempts) == (kind, "user simulator", 3)
    assert c.faults == {kind: 3}


async def test_user_simulator_retries_an_answer_without_text(openai_stub):
    openai_stub.set_script("u", lambda b: Reply(content="Hello there"))
    openai_stub.inject("empty_content", 1)

    class Task:
        def user_instructions(self):
            return "Reason for call: test"

    async with ChatClient(openai_stub.base_url, "u", retry=FAST, role="user simulator") as c:
        assert await OpenAIUserSimulator(c).reply(Task(), []) == "Hello there"
    assert c.faults == {"empty_reply": 1} and c.retries == 1


async def test_refused_connections_are_classified():
    port = free_port()
    async with ChatClient(f"http://127.0.0.1:{port}/v1", "m", retry=FAST) as c:
        with pytest.raises(EndpointError) as info:
            await c.chat([{"role": "user", "content": "hi"}])
    assert info.value.kind == "connection_refused" and c.faults == {"connection_refused": 3}
