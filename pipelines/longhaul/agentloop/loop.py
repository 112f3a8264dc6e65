"""`LonghaulAirlineAgentLoop`: veRL 0.9.1's `ToolAgentLoop`, driven by longhaul's own episode runner.

Per trajectory veRL builds one loop instance and calls `run(sampling_params, **row)`. The loop:

1. reads the task id from the row (`extra_info.task_id`; see `task_id_from_row`) and where the trajectory sits
   (`RolloutContext`: step, prompt group, session, validation), from which it derives the user simulator's seed,
2. runs `longhaul.envs.runner.run_episode` — the SAME runner evaluation uses — with
   * `VerlTokenPolicy`: a token-in/token-out `Policy` over veRL's `server_manager`. It keeps veRL's runtime
     token list: the first call renders system prompt + tools + first user message with veRL's continuous-token
     builder (prompt, not response); every later call appends the messages the runner added since (tool results,
     user replies) as mask-0 tokens, generates, appends the generated tokens as mask-1 tokens and parses Hermes
     `<tool_call>` blocks (an unparsable block becomes a call with `parse_error`, counted, never dropped). It
     times every generation (`generate_sequences`) and carries the servers' `extra_fields` (weights version);
   * the airline environment (a private copy-on-access DB per episode; tool execution timed as `tool_calls`) and
     the LLM user simulator (one shared HTTP client per worker process and event loop);
   * the spec's limits (turns, tokens per turn, response tokens, tool output characters, repeated calls, tool
     errors: τ²'s `too_many_errors`), applied by the runner exactly as in evaluation;
3. grades once (inside the runner), scores PRM-Lite if configured and sets `reward_score = outcome +
   weight·process`, so veRL skips its reward workers;
4. with `credit: turn` lays the reward out per token (`longhaul.rewards.combine.build_token_rewards`) in the
   returned `LonghaulAgentLoopOutput`, whose `as_dict()` writes that row into `rm_scores` — the only per-token
   reward field veRL's v1 trainer forwards to the advantage estimator. (The v0 trainer, `trainer.use_v1=false`,
   rebuilds `rm_scores` from the scalar `reward_score`; there turn credit falls back to trajectory credit, with
   the same total.)
5. appends one trace line per trajectory under `$LONGHAUL_ROLLOUT_DIR` (`longhaul.agentloop.traces`).

Failures. A trajectory that cannot be graded on its merits raises `TrajectoryFailed` out of `run`: the user
simulator failed after its client's retries (or refused its prompt), or the first prompt is over
`rollout.prompt_length` (policy text + tools + the simulator's opening message). veRL's v1 worker then marks the
prompt's group `failure`, and longhaul's replay buffer for the trainer mode (`longhaul.agentloop.sampler`) drops
the whole group, counts it and refills it with a fresh prompt: the group baseline is never computed from survivors.
Every other ending is graded and trains — including a user who says ###STOP### before the policy spoke (response:
one masked token; reward: the grade), the limits (turns, response tokens, repeated calls, `max_tool_errors` tool
errors) and format errors (score 0 as in τ²).

`extra_fields` carry `turn_scores` (weight·q_k per turn), `reward_extra_info` (`acc` = `outcome`, which veRL
makes its core validation metric instead of the shaped reward; process, tool-call counts, unknown/unparsable
calls, abort flag), the task id, the termination, `rollout_seed` and veRL's weights-version tags
(`global_steps`, `min_global_steps`, `max_global_steps`, always integers).

The token-level policy is `longhaul.agentloop.policy.VerlTokenPolicy`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.utils.profiler import simple_timer

from longhaul.agentloop.context import RolloutContext
from longhaul.agentloop.policy import VERSION_KEYS, VerlTokenPolicy, render_prompt_tokens, template_messages
from longhaul.agentloop.traces import build_trace_record, log_trace, rollout_dir_from_env
from longhaul.clients.openai_compat import shared_chat_client
from longhaul.clients.policy import SamplingParams
from longhaul.clients.ready import wait_from_env, wait_until_serving
from longhaul.clients.user_simulator import OpenAIUserSimulator
from longhaul.envs.airline.env import AirlineEnv, ToolAction
from longhaul.envs.airline.tasks import get_task
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.prompt import tool_schemas
from longhaul.envs.protocols import ContextOverflowError, PolicyEndpointError
from longhaul.envs.runner import run_episode
from longhaul.envs.trajectory import Termination, Trajectory
from longhaul.rewards.combine import RewardBreakdown, RewardSettings, build_token_rewards
from longhaul.rewards.prm_lite import build_rule_params, score_trajectory


class TrajectoryFailed(RuntimeError):
    """A trajectory that cannot be graded on its merits (module docstring). Raised out of the agent loop's `run`
    so veRL marks the prompt's group failed; `reason` is `user_simulator_error` or `prompt_over_budget`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"trajectory failed ({reason}): {detail}")
        self.reason = reason


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
                    f"token_rewards has {row.shape[0]} entries but the response has {output['response_mask'].shape[0]} tokens"  # noqa: E501 - a string literal kept whole
                )
            output["rm_scores"] = row
        return output


class _TimedTools:
    """The episode's environment, with the time spent executing tool calls added to veRL's `tool_calls` metric
    (the runner executes them; veRL's ToolAgentLoop times its own the same way)."""

    def __init__(self, env: Any, metrics: dict[str, Any]) -> None:
        self._env, self._metrics = env, metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def step(self, action: Any) -> Any:
        if not isinstance(action, ToolAction):
            return self._env.step(action)
        with simple_timer("tool_calls", self._metrics):
            return self._env.step(action)


class _FailingUser:
    """The user simulator, timed, with its endpoint failures turned into `TrajectoryFailed`."""

    def __init__(self, user: Any, timing: dict[str, float]) -> None:
        self._user, self._timing = user, timing

    async def reply(self, task: Any, conversation: list[dict[str, str]]) -> str:
        try:
            with simple_timer("user_simulator", self._timing):
                return await self._user.reply(task, conversation)
        except (PolicyEndpointError, ContextOverflowError) as exc:
            raise TrajectoryFailed("user_simulator_error", f"{type(exc).__name__}: {exc}") from exc


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


def _failure(traj: Trajectory, policy: VerlTokenPolicy) -> TrajectoryFailed | None:
    """Why a finished episode cannot be graded on its merits: an endpoint the harness lost, or a first prompt over
    `rollout.prompt_length`; None for every other ending (graded, and it trains)."""
    if traj.termination == Termination.ENDPOINT_ERROR:  # the harness ended it, not the agent: never trains
        return TrajectoryFailed("endpoint_error", str(traj.metadata.get("endpoint_error", "")))
    if policy.prompt_overflow is not None or traj.termination == Termination.CONTEXT_OVERFLOW:
        return TrajectoryFailed("prompt_over_budget", policy.prompt_overflow or "the first prompt is over budget")
    return None


class LonghaulAirlineAgentLoop(ToolAgentLoop):
    """τ² airline episodes inside veRL rollouts (module docstring). Constructed by veRL from the
    `agent_loop_config_path` entry rendered by `longhaul.agentloop.config.render_agent_loop_yaml`."""

    #: Retries of the user simulator's client (None: `RetryPolicy()`'s defaults).
    user_retry: Any = None

    def __init__(self, *args: Any, limits: Any, reward: Any, user_simulator: Any, **kwargs: Any) -> None:
        kwargs.pop("name", None)
        super().__init__(*args, **kwargs)
        self.limits = EpisodeLimits(**_plain(limits))
        self.reward_settings = RewardSettings.from_dict(_plain(reward))
        self.user_settings = dict(_plain(user_simulator))
        self.rule_params = build_rule_params(self.reward_settings.rules)

    # Overridable factories (tests replace them with scripted stand-ins).
    def make_env(self) -> Any:
        """A fresh airline environment for one episode."""
        return AirlineEnv()

    def make_task(self, task_id: str) -> Any:
        """The τ² airline task of a dataset row."""
        return get_task(task_id)

    def make_user_simulator(self, row: Mapping[str, Any], seed: int) -> Any:
        """The LLM user simulator for one trajectory, sampling with `seed`, over the worker's shared HTTP client
        (one per process and event loop: building pools per trajectory blocked the worker's loop)."""
        s = self.user_settings
        key = os.environ.get(s["api_key_env"]) if s.get("api_key_env") else None
        client = shared_chat_client(
            s["base_url"], s["model"], api_key=key, role="user simulator", retry=self.user_retry
        )
        return OpenAIUserSimulator(client, SamplingParams(s["temperature"], s["top_p"], s["max_tokens"]), seed=seed)

    async def await_simulator(self) -> None:
        """Wait until the user simulator serves: the launcher starts the trainer while the simulator still loads
        (`longhaul.clients.ready`; once per process, no wait outside a launch)."""
        s = self.user_settings
        key = os.environ.get(s["api_key_env"]) if s.get("api_key_env") else None
        await wait_until_serving(s["base_url"], wait_from_env(), api_key=key)

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
        """One trajectory of a dataset row (module docstring): run the episode, fail it or reward it, trace it."""
        started = time.perf_counter()
        ctx = RolloutContext.from_row(kwargs)
        task = self.make_task(task_id_from_row(kwargs))
        request_id = self._make_request_id(priority, self.rollout_config.full_determinism)
        await self.await_simulator()
        policy = VerlTokenPolicy(self, sampling_params, request_id)
        timing: dict[str, float] = {}
        user = _FailingUser(self.make_user_simulator(kwargs, ctx.seed), timing)
        transcript: list[dict[str, Any]] = []
        trace_root = rollout_dir_from_env()
        try:
            traj = await run_episode(
                _TimedTools(self.make_env(), policy.metrics),
                task,
                policy,
                user,
                self.limits,
                trial=ctx.session,
                seed=ctx.seed,
                on_message=transcript.append,
            )
        except TrajectoryFailed as exc:
            if trace_root:
                record = build_trace_record(
                    ctx, None, task_id=str(task.id), failed=exc.reason, error=str(exc), messages=transcript
                )
                await log_trace(trace_root, ctx, record, failed=True)
            raise
        failed = _failure(traj, policy)
        if failed is not None:
            if trace_root:
                # `trajectory` stays null for a failure (readers such as `longhaul explain` skip it: it never
                # trained); the runner's record of what happened is kept beside it
                record = build_trace_record(
                    ctx,
                    None,
                    task_id=traj.task_id,
                    failed=failed.reason,
                    error=str(failed),
                    failed_trajectory=traj.to_dict(),
                )
                await log_trace(trace_root, ctx, record, failed=True)
            raise failed
        if policy.token_ids is None:
            # The episode ended before the first generation (the user's opening message said ###STOP###): a
            # legitimate, graded ending. veRL still needs a prompt; the response is one masked pad token.
            full = await render_prompt_tokens(self, template_messages(traj.messages[:2]), tool_schemas())
            policy.token_ids = full[-self.prompt_length :]
            policy.prompt_len = len(policy.token_ids)
        output, reward = self.build_output(traj, policy, ctx)
        if trace_root:
            timing.update(
                generate_sequences=policy.metrics["generate_sequences"],
                tool_calls=policy.metrics["tool_calls"],
                total=time.perf_counter() - started,
            )
            await log_trace(trace_root, ctx, self._trace_record(ctx, traj, output, reward, timing))
        return output

    def _trace_record(
        self,
        ctx: RolloutContext,
        traj: Trajectory,
        output: LonghaulAgentLoopOutput,
        reward: RewardBreakdown,
        timing: dict[str, float],
    ) -> dict[str, Any]:
        """The trace line of a trajectory that trains: the trajectory, its reward, tokens, weights version, timing."""
        return build_trace_record(
            ctx,
            traj.to_dict(),
            task_id=traj.task_id,
            termination=str(traj.termination),
            reward={
                "score": reward.score,
                "outcome": reward.outcome,
                "process": reward.process,
                "weight": reward.weight,
                "turn_rewards": list(reward.turn_rewards),
                "credit": self.reward_settings.credit,
            },
            reward_extra_info=output.extra_fields["reward_extra_info"],
            tokens={
                "prompt": len(output.prompt_ids),
                "response": len(output.response_ids),
                "generated": int(sum(output.response_mask)),
            },
            weights_version={k: output.extra_fields[k] for k in VERSION_KEYS},
            timing={k: round(v, 6) for k, v in timing.items()},
        )

    def build_output(
        self, traj: Any, policy: VerlTokenPolicy, ctx: RolloutContext
    ) -> tuple[LonghaulAgentLoopOutput, RewardBreakdown]:
        """Reward the graded trajectory and package veRL's output. Every output of a batch has the same fields
        (TransferQueue keeps only the fields all samples have): log-probs of the response's length whenever
        veRL calculates them, integer weights-version tags, the same `extra_fields` keys. A response has at least
        one token: an empty one becomes a single masked pad token, so veRL's tensors stay well formed."""
        rs = self.reward_settings
        prm = score_trajectory(traj, self.rule_params, seed_compat=rs.seed_compat) if rs.process_on else None
        reward = rs.combine(traj.outcome, prm)
        ids = policy.token_ids or []
        n = self.response_length
        response_ids = ids[policy.prompt_len :][:n]
        mask = policy.response_mask[:n]
        logprobs = None
        if policy.calculate_log_probs:
            logprobs = list(policy.response_logprobs[:n])
            logprobs += [0.0] * (len(mask) - len(logprobs))
        elif policy.response_logprobs:
            logprobs = policy.response_logprobs[:n]
        if not response_ids:
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            response_ids, mask = [pad], [0]
            logprobs = [0.0] if logprobs is not None else None
        token_rewards = None
        if rs.credit == "turn" and any(mask):
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
            "num_unparsed_tool_calls": prm.num_unparsed_tool_calls
            if prm
            else sum(1 for t in traj.turns for c in t.tool_calls if c.parse_error is not None),
            "aborted": float(traj.aborted),
            "num_assistant_turns": len(traj.turns),
        }
        output = LonghaulAgentLoopOutput(
            prompt_ids=ids[: policy.prompt_len],
            response_ids=response_ids,
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward.score,
            num_turns=len(traj.messages) - 1,
            metrics=policy.metrics,
            extra_fields={
                **policy.output_extra_fields(ctx),
                "turn_scores": list(reward.turn_rewards),
                "tool_rewards": [],
                "reward_extra_info": info,
                "task_id": traj.task_id,
                "termination": str(traj.termination),
                "rollout_seed": ctx.seed,
            },
            token_rewards=token_rewards,
        )
        return output, reward
