"""`LonghaulAirlineAgentLoop`: veRL 0.9.1's `ToolAgentLoop`, driven by longhaul's own episode runner.

Per trajectory veRL builds one loop instance and calls `run(sampling_params, **row)`. The loop:

1. reads the task id from the row (`extra_info.task_id`; see `task_id_from_row`),
2. runs `longhaul.envs.runner.run_episode` — the SAME runner evaluation uses — with
   * `VerlTokenPolicy`: a token-in/token-out `Policy` over veRL's `server_manager`. It keeps veRL's runtime
     token list: the first call renders system prompt + tools + first user message with veRL's continuous-token
     builder (prompt, not response); every later call appends the messages the runner added since (tool results,
     user replies) as mask-0 tokens, generates, appends the generated tokens as mask-1 tokens and parses Hermes
     `<tool_call>` blocks (an unparsable block becomes a call with `parse_error`, counted, never dropped);
   * the airline environment (a private copy-on-access DB per episode) and the LLM user simulator;
   * the spec's limits (turns, tokens per turn, response tokens, tool output characters, repeated calls);
3. grades once (inside the runner), scores PRM-Lite if configured and sets `reward_score = outcome +
   weight·process`, so veRL skips its reward workers;
4. with `credit: turn` lays the reward out per token (`longhaul.rewards.combine.build_token_rewards`) in the
   returned `LonghaulAgentLoopOutput`, whose `as_dict()` writes that row into `rm_scores` — the only per-token
   reward field veRL's v1 trainer forwards to the advantage estimator. (The v0 trainer, `trainer.use_v1=false`,
   rebuilds `rm_scores` from the scalar `reward_score`; there turn credit falls back to trajectory credit, with
   the same total.)

`extra_fields` carry `turn_scores` (weight·q_k per turn), `reward_extra_info` (`acc` = `outcome`, which veRL
makes its core validation metric instead of the shaped reward; process, tool-call counts, unknown/unparsable
calls, abort flag) and the task id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from longhaul.envs.runner import ContextOverflowError, EpisodeLimits, ParsedCall, PolicyTurn, run_episode
from longhaul.rewards.combine import build_token_rewards, combine_reward
from longhaul.rewards.prm_lite import build_rule_params, score_trajectory

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


class LonghaulAgentLoopOutput(AgentLoopOutput):
    """`AgentLoopOutput` plus an optional per-token reward row that replaces veRL's scalar-at-the-end layout."""

    token_rewards: list[float] | None = None

    def as_dict(self) -> dict[str, Any]:
        output = super().as_dict()
        output.pop("token_rewards", None)
        if self.token_rewards is not None:
            row = torch.tensor(self.token_rewards, dtype=torch.float32)
            if row.shape != output["response_mask"].shape:
                raise ValueError(
                    f"token_rewards has {row.shape[0]} entries but the response has {output['response_mask'].shape[0]} tokens"
                )
            output["rm_scores"] = row
        return output


def parse_hermes(text: str) -> tuple[str, list[ParsedCall]]:
    """Split a Hermes-format completion into the text around tool calls and the calls themselves. A block that
    is not `{"name": ..., "arguments": {...}}` becomes a call with `parse_error` set (the runner turns it into an
    error observation; PRM-Lite counts it) instead of silently disappearing."""
    calls = []
    for block in _TOOL_CALL.findall(text):
        raw = block.strip()
        m = _NAME.search(raw)
        name = m.group(1) if m else "<unparsed>"
        try:
            obj = json.loads(raw)
            name = obj["name"] if isinstance(obj, dict) and isinstance(obj.get("name"), str) else "<unparsed>"
            args = obj["arguments"] if isinstance(obj, dict) and "arguments" in obj else {}
            if isinstance(args, str):
                args = json.loads(args)
            if name == "<unparsed>" or not isinstance(args, dict):
                raise ValueError("expected {\"name\": string, \"arguments\": object}")
            calls.append(ParsedCall(name, args, json.dumps(args, ensure_ascii=False)))
        except (ValueError, TypeError) as e:
            calls.append(ParsedCall(name, None, raw, parse_error=f"{type(e).__name__}: {e}"))
    return _TOOL_CALL.sub("", text).strip(), calls


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


class VerlTokenPolicy:
    """A `Policy` over veRL's LLM server manager that keeps veRL's token-level state (ids, mask, log-probs)."""

    def __init__(self, loop: ToolAgentLoop, sampling_params: dict[str, Any], request_id: str) -> None:
        self.loop = loop
        self.sampling_params = dict(sampling_params)
        self.request_id = request_id
        self.token_ids: list[int] | None = None
        self.prompt_len = 0
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self._synced = 0  # messages already represented in token_ids (plus the assistant turn just generated)
        self.metrics: dict[str, Any] = {"generate_sequences": 0.0, "num_preempted": -1}

    async def next_turn(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int) -> PolicyTurn:
        loop = self.loop
        msgs = _template_messages(messages)
        if self.token_ids is None:
            # Rendered without veRL's prompt cap: veRL would silently left-truncate a long prompt (cutting the
            # policy text); longhaul ends the episode as context_overflow instead (a premature end, scored 0).
            full = await render_prompt_tokens(loop, msgs, tools)
            self.token_ids = full[-loop.prompt_length:]
            self.prompt_len = len(self.token_ids)
            if len(full) > loop.prompt_length:
                raise ContextOverflowError(f"prompt has {len(full)} tokens; rollout.prompt_length is {loop.prompt_length}")
        else:
            previous = msgs[: self._synced + 1]  # up to and including the assistant turn generated last
            if len(msgs) > len(previous):
                merge, mask, lps = await loop.ct_merge_context_msg(
                    previous, msgs, self.token_ids, self.response_mask,
                    self.response_logprobs if self.response_logprobs else None, tools=tools,
                )
                self.token_ids = list(merge.token_ids)
                self.response_mask = list(mask)
                if self.response_logprobs:
                    self.response_logprobs = list(lps or [])
        self._synced = len(msgs)
        prompt_tokens = len(self.token_ids)

        params = dict(self.sampling_params)
        remaining = loop.response_length - len(self.response_mask)
        params["max_tokens"] = max(1, min(int(max_tokens), remaining))
        stop = loop.tool_parser.stop_token_ids
        if stop:
            params["stop_token_ids"] = list(set((params.get("stop_token_ids") or []) + list(stop)))
        out = await loop.server_manager.generate(
            request_id=self.request_id, prompt_ids=self.token_ids, sampling_params=params,
            image_data=None, video_data=None,
        )
        if out.num_preempted is not None:
            self.metrics["num_preempted"] = max(self.metrics["num_preempted"], 0) + out.num_preempted
        merge, mask, lps = await loop.ct_merge_assistant_token(
            self.token_ids, out.token_ids, self.response_mask,
            self.response_logprobs if (self.response_logprobs or out.log_probs) else None,
            assistant_logprobs=out.log_probs or None,
        )
        self.token_ids = list(merge.token_ids)
        self.response_mask = list(mask)
        if lps is not None:
            self.response_logprobs = list(lps)

        text = loop.tokenizer.decode(out.token_ids, skip_special_tokens=False)
        for tok in {loop.tokenizer.eos_token, loop.tokenizer.pad_token, "<|im_end|>", "<|endoftext|>"}:
            if tok:
                text = text.replace(tok, "")
        if loop.tool_parser_name == "hermes":
            content, calls = parse_hermes(text)
        else:
            content, fcalls = await loop.tool_parser.extract_tool_calls(out.token_ids, None)
            calls = []
            for fc in fcalls:
                try:
                    args = json.loads(fc.arguments)
                    calls.append(ParsedCall(fc.name, args if isinstance(args, dict) else None, fc.arguments,
                                            None if isinstance(args, dict) else "arguments are not an object"))
                except ValueError as e:
                    calls.append(ParsedCall(fc.name, None, fc.arguments, parse_error=str(e)))
        return PolicyTurn(
            content=content, tool_calls=calls, completion_tokens=len(out.token_ids),
            finish_reason=out.stop_reason, prompt_tokens=prompt_tokens,
        )


async def render_prompt_tokens(loop: ToolAgentLoop, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
    """System prompt + tools + first user message as veRL's continuous-token builder renders them (uncapped)."""
    builder = loop.continuous_token_builder
    return list(await loop.loop.run_in_executor(None, lambda: builder.build_initial_tokens(messages, tools=tools)))


def task_id_from_row(row: Mapping[str, Any]) -> str:
    """The task of a dataset row: `extra_info.task_id` (also accepted: `extra_info.interaction_kwargs.task_id`,
    `tools_kwargs.task_id`)."""
    extra = row.get("extra_info") or {}
    for source in (extra, extra.get("interaction_kwargs") or {}, row.get("tools_kwargs") or {}):
        if isinstance(source, Mapping) and source.get("task_id") is not None:
            return str(source["task_id"])
    raise ValueError(
        "dataset row has no task id: set extra_info.task_id (the τ² airline task id) in the training parquet; "
        f"row keys: {sorted(row)}"
    )


def _plain(x: Any) -> Any:
    if isinstance(x, DictConfig):
        return OmegaConf.to_container(x, resolve=True)
    return x


class LonghaulAirlineAgentLoop(ToolAgentLoop):
    """τ² airline episodes inside veRL rollouts (module docstring). Constructed by veRL from the
    `agent_loop_config_path` entry rendered by `longhaul.agentloop.config.render_agent_loop_yaml`."""

    def __init__(self, *args: Any, limits: Any, reward: Any, user_simulator: Any, **kwargs: Any) -> None:
        kwargs.pop("name", None)
        super().__init__(*args, **kwargs)
        self.limits = EpisodeLimits(**_plain(limits))
        self.reward_settings = dict(_plain(reward))
        self.user_settings = dict(_plain(user_simulator))
        self.rule_params = build_rule_params(self.reward_settings.get("rules") or {})

    # Overridable factories (tests replace them with scripted stand-ins).
    def make_env(self) -> Any:
        from longhaul.envs.airline.env import AirlineEnv

        return AirlineEnv()

    def make_task(self, task_id: str) -> Any:
        from longhaul.envs.airline.tasks import get_task

        return get_task(task_id)

    def make_user_simulator(self, row: Mapping[str, Any]) -> Any:
        import os

        from longhaul.clients.openai_compat import ChatClient
        from longhaul.clients.policy import SamplingParams
        from longhaul.clients.user_simulator import OpenAIUserSimulator

        s = self.user_settings
        key = os.environ.get(s["api_key_env"]) if s.get("api_key_env") else None
        client = ChatClient(s["base_url"], s["model"], api_key=key, role="user_simulator")
        seed = (row.get("extra_info") or {}).get("seed")
        return OpenAIUserSimulator(client, SamplingParams(s["temperature"], s["top_p"], s["max_tokens"]), seed=seed)

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        task = self.make_task(task_id_from_row(kwargs))
        request_id = self._make_request_id(priority, self.rollout_config.full_determinism)
        policy = VerlTokenPolicy(self, sampling_params, request_id)
        user = self.make_user_simulator(kwargs)
        extra = kwargs.get("extra_info") or {}
        traj = await run_episode(
            self.make_env(), task, policy, user, self.limits,
            trial=int(extra.get("trial", 0) or 0), seed=extra.get("seed"),
        )
        if policy.token_ids is None:
            # The episode ended before the first generation (e.g. the user's opening message said ###STOP###):
            # veRL still needs a prompt; the response is one masked pad token.
            from longhaul.envs.runner import tool_schemas

            full = await render_prompt_tokens(self, _template_messages(traj.messages[:2]), tool_schemas())
            policy.token_ids = full[-self.prompt_length:]
            policy.prompt_len = len(policy.token_ids)
        return self.build_output(traj, policy)

    def build_output(self, traj: Any, policy: VerlTokenPolicy) -> LonghaulAgentLoopOutput:
        """Reward the graded trajectory and package veRL's output (a response has at least one token: an empty
        one becomes a single masked pad token, so veRL's tensors stay well formed)."""
        rs = self.reward_settings
        prm = None
        if rs["process"] == "prm_lite":
            prm = score_trajectory(traj, self.rule_params, seed_compat=bool(rs["seed_compat"]))
        reward = combine_reward(traj.outcome, prm, float(rs["weight"]) if prm is not None else 0.0)
        ids = policy.token_ids or []
        n = self.response_length
        response_ids = ids[policy.prompt_len:][:n]
        mask = policy.response_mask[:n]
        logprobs = policy.response_logprobs[:n] if policy.response_logprobs else None
        if not response_ids:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            response_ids, mask = [pad], [0]
            logprobs = [0.0] if logprobs is not None else None
        token_rewards = None
        if rs["credit"] == "turn" and any(mask):
            token_rewards = build_token_rewards(reward, mask, "turn")
        info = {
            # veRL reports `acc` (when present) as the core validation metric instead of the reward: the
            # binary outcome, never the process-shaped score (method.md h.12).
            "acc": reward.outcome,
            "outcome": reward.outcome,
            "process": reward.process,
            "num_tool_calls": traj.num_tool_calls,
            "num_tool_errors": traj.num_tool_errors,
            "num_unknown_tool_calls": prm.num_unknown_tool_calls if prm else traj.num_unknown_tool_calls,
            "num_unparsed_tool_calls": prm.num_unparsed_tool_calls if prm else sum(
                1 for t in traj.turns for c in t.tool_calls if c.parse_error is not None),
            "aborted": float(traj.aborted),
            "num_assistant_turns": len(traj.turns),
        }
        return LonghaulAgentLoopOutput(
            prompt_ids=ids[: policy.prompt_len],
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward.score,
            num_turns=len(traj.messages) - 1,
            metrics=policy.metrics,
            extra_fields={
                "turn_scores": list(reward.turn_rewards),
                "tool_rewards": [],
                "reward_extra_info": info,
                "task_id": traj.task_id,
                "termination": str(traj.termination),
            },
            token_rewards=token_rewards,
        )
