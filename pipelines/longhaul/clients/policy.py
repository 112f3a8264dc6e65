"""The policy over an OpenAI-compatible endpoint, with Hermes-style tool calls.

vLLM's `--tool-call-parser hermes` returns parsed `tool_calls`; when a server leaves `<tool_call>{…}</tool_call>`
blocks in the text instead (no parser, or a block the parser rejected), the text is parsed by training's own parser
(`longhaul.envs.hermes`), so evaluation turns the same generation into the same calls and messages as training.
Arguments that are not a JSON object become a `ParsedCall` with `parse_error` set: the environment answers with an
error observation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from longhaul.clients.openai_compat import ChatClient
from longhaul.envs.hermes import parse_hermes
from longhaul.envs.protocols import ParsedCall, PolicyTurn


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.9
    max_tokens: int | None = None  # None: the runner's per-turn limit

    @classmethod
    def from_spec(cls, sampling: Any) -> SamplingParams:
        return cls(temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens)


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str, str | None]:
    """(arguments, raw text, parse error) for a tool call's `arguments` field."""
    if isinstance(raw, dict):
        return raw, json.dumps(raw), None
    text = "" if raw is None else str(raw)
    if not text.strip():
        return {}, text, None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, text, f"invalid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return None, text, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, text, None


def parse_chat_response(data: dict[str, Any]) -> PolicyTurn:
    """A `PolicyTurn` from an OpenAI chat completion response (one `ChatClient.chat` returned, so its shape is
    checked: `longhaul.clients.openai_compat.check_completion`)."""
    choice = data["choices"][0]
    msg = choice.get("message") or {}
    content = msg.get("content") or ""
    calls: list[ParsedCall] = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args, raw, err = parse_arguments(fn.get("arguments"))
        calls.append(ParsedCall(str(fn.get("name") or "<unnamed>"), args, raw, err, call_id=tc.get("id")))
    content, inline = parse_hermes(content)
    calls.extend(inline)
    usage = data.get("usage") or {}
    return PolicyTurn(
        content=content,
        tool_calls=calls,
        completion_tokens=int(usage.get("completion_tokens") or 0),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens"),
    )


class OpenAIPolicy:
    """`Policy` over a chat endpoint. One instance per episode when seeds matter (`with_seed`)."""

    def __init__(self, client: ChatClient, sampling: SamplingParams | None = None, *, seed: int | None = None) -> None:
        self.client = client
        self.sampling = sampling or SamplingParams()
        self.seed = seed

    def with_seed(self, seed: int | None) -> OpenAIPolicy:
        return OpenAIPolicy(self.client, self.sampling, seed=seed)

    async def next_turn(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int
    ) -> PolicyTurn:
        cap = max_tokens if self.sampling.max_tokens is None else min(max_tokens, self.sampling.max_tokens)
        data = await self.client.chat(
            messages,
            tools=tools,
            tool_choice="auto",
            max_tokens=cap,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            seed=self.seed,
        )
        return parse_chat_response(data)
