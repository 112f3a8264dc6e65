"""`VerlTokenPolicy`: the episode runner's `Policy` over veRL's LLM server manager, token in, token out.

It keeps veRL's runtime token list: the first call renders system prompt + tools + first user message with veRL's
continuous-token builder (prompt, not response); every later call appends the messages the runner added since
(tool results, user replies) as mask-0 tokens, generates, appends the generated tokens as mask-1 tokens and parses
Hermes `<tool_call>` blocks (an unparsable block becomes a call with `parse_error`, counted, never dropped). It
times every generation (`generate_sequences`) and carries the servers' `extra_fields` (weights version).
"""

from __future__ import annotations

import json
from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.utils.profiler import simple_timer

from longhaul.agentloop.context import RolloutContext
from longhaul.envs.hermes import parse_hermes
from longhaul.envs.protocols import ContextOverflowError, ParsedCall, PolicyTurn


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call arguments as objects when they parse."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            m = dict(m)
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        parsed = json.loads(fn["arguments"])
                        if isinstance(parsed, dict):
                            fn["arguments"] = parsed
                    except ValueError:
                        pass
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


#: Keys of the servers' `extra_fields` that count something per generation (0 for a trajectory without one).
_COUNT_KEYS = ("num_cached_tokens", "spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")
_SPEC_KEYS = _COUNT_KEYS[1:]
#: The weights-version tags veRL's v1 trainer reads as integers from every trajectory (`_compute_metrics`).
VERSION_KEYS = ("global_steps", "min_global_steps", "max_global_steps")
#: Server `extra_fields` keys seen in this process: a trajectory without a generation carries them too, so every
#: output of a batch has the same keys.
_SERVER_KEYS_SEEN: set[str] = set()


def generation_version(extra: dict[str, Any]) -> tuple[int, int] | None:
    """(first, last) weights version of one generation from veRL's `extra_fields`: a generation an asynchronous
    trainer aborted at a weight update and resumed with the new weights reports both (veRL's fully-async client),
    an uninterrupted one a single version; None when the server reports none."""
    one = extra.get("global_steps")
    lo, hi = extra.get("min_global_steps", one), extra.get("max_global_steps", one)
    if lo is None and hi is None:
        return None
    lo = int(hi if lo is None else lo)
    hi = int(lo if hi is None else hi)
    return (min(lo, hi), max(lo, hi))


class VerlTokenPolicy:
    """A `Policy` over veRL's LLM server manager that keeps veRL's token-level state (ids, mask, log-probs) and
    what veRL's servers report per generation (`extra_fields`: weights version, cache and spec-decode counts)."""

    def __init__(self, loop: ToolAgentLoop, sampling_params: dict[str, Any], request_id: str) -> None:
        self.loop = loop
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id
        self.calculate_log_probs = bool(loop.rollout_config.calculate_log_probs)
        self.token_ids: list[int] | None = None
        self.prompt_len = 0
        self.prompt_overflow: str | None = None  # why the first prompt was refused, if it was
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.generations = 0
        self.extra_fields: dict[str, Any] = {}
        self._synced = 0  # messages already represented in token_ids (plus the assistant turn just generated)
        self.metrics: dict[str, Any] = {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}

    def _logprobs_arg(self, incoming: list[float] | None) -> list[float] | None:
        if self.calculate_log_probs:
            return self.response_logprobs  # always carried (0.0 on context tokens), even before the first generation
        return self.response_logprobs if (self.response_logprobs or incoming) else None

    def _record_extra_fields(self, extra: dict[str, Any]) -> None:
        """veRL's ToolAgentLoop semantics: the first generation's fields as they are, later ones only move
        `max_global_steps` forward and add up the spec-decode counts."""
        _SERVER_KEYS_SEEN.update(extra)
        if self.generations == 0:
            self.extra_fields.update(extra)
            return
        if extra.get("max_global_steps") is not None:
            self.extra_fields["max_global_steps"] = extra["max_global_steps"]
        for key in _SPEC_KEYS:
            if key in extra and key in self.extra_fields:
                self.extra_fields[key] = int(self.extra_fields[key] or 0) + int(extra[key] or 0)

    async def next_turn(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int
    ) -> PolicyTurn:
        """The next assistant turn: what the runner added since the last turn joins veRL's token list (the first
        call renders the prompt), then one generation, appended as response tokens, its tool calls parsed."""
        prompt_tokens = await self._sync_messages(template_messages(messages), tools)
        out = await self._generate(max_tokens)
        content, calls = await self._parse_turn(out.token_ids)
        return PolicyTurn(
            content=content,
            tool_calls=calls,
            completion_tokens=len(out.token_ids),
            finish_reason=out.stop_reason,
            prompt_tokens=prompt_tokens,
            policy_version=generation_version(dict(out.extra_fields or {})),
        )

    async def _sync_messages(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        """Bring the token list up to `msgs`; returns its length (the prompt of the coming generation)."""
        loop = self.loop
        if self.token_ids is None:
            # Rendered without veRL's prompt cap: veRL would silently left-truncate a long prompt (cutting the
            # policy text); the runner ends the episode as context_overflow and the loop fails the trajectory.
            full = await render_prompt_tokens(loop, msgs, tools)
            self.token_ids = full[-loop.prompt_length :]
            self.prompt_len = len(self.token_ids)
            if len(full) > loop.prompt_length:
                self.prompt_overflow = f"prompt has {len(full)} tokens; rollout.prompt_length is {loop.prompt_length}"
                raise ContextOverflowError(self.prompt_overflow)
        else:
            previous = msgs[: self._synced + 1]  # up to and including the assistant turn generated last
            if len(msgs) > len(previous):
                merge, mask, lps = await loop.ct_merge_context_msg(
                    previous,
                    msgs,
                    self.token_ids,
                    self.response_mask,
                    self._logprobs_arg(None),
                    tools=tools,
                )
                self.token_ids = list(merge.token_ids)
                self.response_mask = list(mask)
                if lps is not None:
                    self.response_logprobs = list(lps)
        self._synced = len(msgs)
        return len(self.token_ids)

    async def _generate(self, max_tokens: int) -> Any:
        """One generation within the turn's and the response's token budgets, appended as response tokens."""
        loop = self.loop
        params = dict(self.sampling_params)
        remaining = loop.response_length - len(self.response_mask)
        params["max_tokens"] = max(1, min(int(max_tokens), remaining))
        stop = loop.tool_parser.stop_token_ids
        if stop:
            params["stop_token_ids"] = list(set((params.get("stop_token_ids") or []) + list(stop)))
        with simple_timer("generate_sequences", self.metrics):
            out = await loop.server_manager.generate(
                request_id=self.request_id,
                prompt_ids=self.token_ids,
                sampling_params=params,
                image_data=None,
                video_data=None,
            )
        if out.num_preempted is not None:
            self.metrics["num_preempted"] = max(self.metrics["num_preempted"], 0) + out.num_preempted
        self._record_extra_fields(dict(out.extra_fields or {}))
        self.generations += 1
        merge, mask, lps = await loop.ct_merge_assistant_token(
            self.token_ids,
            out.token_ids,
            self.response_mask,
            self._logprobs_arg(out.log_probs),
            assistant_logprobs=out.log_probs or None,
        )
        self.token_ids = list(merge.token_ids)
        self.response_mask = list(mask)
        if lps is not None:
            self.response_logprobs = list(lps)
        return out

    async def _parse_turn(self, token_ids: list[int]) -> tuple[str, list[ParsedCall]]:
        """The generated text without end-of-turn tokens, and its tool calls (Hermes, or veRL's tool parser)."""
        loop = self.loop
        text = loop.tokenizer.decode(token_ids, skip_special_tokens=False)
        for tok in {loop.tokenizer.eos_token, loop.tokenizer.pad_token, "<|im_end|>", "<|endoftext|>"}:
            if tok:
                text = text.replace(tok, "")
        if loop.tool_parser_name == "hermes":
            return parse_hermes(text)
        content, fcalls = await loop.tool_parser.extract_tool_calls(token_ids, None)
        calls = []
        for fc in fcalls:
            try:
                args = json.loads(fc.arguments)
                calls.append(
                    ParsedCall(
                        fc.name,
                        args if isinstance(args, dict) else None,
                        fc.arguments,
                        None if isinstance(args, dict) else "arguments are not an object",
                    )
                )
            except ValueError as e:
                calls.append(ParsedCall(fc.name, None, fc.arguments, parse_error=str(e)))
        return content, calls

    def output_extra_fields(self, ctx: RolloutContext) -> dict[str, Any]:
        """The server fields for the output, with integer version tags. A trajectory without a generation (or a
        server that reports no version) gets the version its step runs with (`RolloutContext.weights_version_floor`)
        and the count keys this process's server reports, set to 0."""
        fields = dict(self.extra_fields)
        if self.generations == 0:
            for key in _SERVER_KEYS_SEEN - set(VERSION_KEYS):
                fields.setdefault(key, 0 if key in _COUNT_KEYS else None)
        floor = ctx.weights_version_floor()
        lo = fields.get("min_global_steps", fields.get("global_steps"))
        hi = fields.get("max_global_steps", fields.get("global_steps"))
        lo = floor if lo is None else int(lo)
        hi = lo if hi is None else int(hi)
        fields.update(
            global_steps=hi if fields.get("global_steps") is None else int(fields["global_steps"]),
            min_global_steps=lo,
            max_global_steps=max(lo, hi),
        )
        return fields


async def render_prompt_tokens(
    loop: ToolAgentLoop, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[int]:
    """System prompt + tools + first user message as veRL's continuous-token builder renders them (uncapped)."""
    builder = loop.continuous_token_builder
    return list(await loop.loop.run_in_executor(None, lambda: builder.build_initial_tokens(messages, tools=tools)))
