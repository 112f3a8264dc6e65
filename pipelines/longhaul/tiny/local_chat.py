"""A tiny model as an in-process chat endpoint, so the demo's own evaluation can run without a server.

`LocalChat.chat` takes what `longhaul.clients.openai_compat.ChatClient.chat` takes and answers in the shape of an
OpenAI chat completion, so the evaluation's real policy and user-simulator clients (`build_eval_agents`), the
episode runner, the environment and the grader all run unchanged on top of it. What differs from the demo's
vLLM server is only the server: transformers samples instead of vLLM (same model, same chat template, same
temperature and top-p; another random stream), and tool calls come back as text — as vLLM's hermes parser returns
a turn with any malformed block — which `parse_chat_response` parses with the one parser of training and
evaluation (`longhaul.envs.hermes`), so a turn moves the environment as it would through vLLM.

`step0_estimate` runs the demo's step-0 evaluation (its training tasks, its samples and seeds, its limits) on a
build's models this way: what `make demo` will start from, measured by the build itself (`longhaul.tiny.recipe`
gates on it), with no GPU, vLLM or Ray.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Any

from longhaul.tiny.checks import PrefixCache, extends, prompt_ids
from longhaul.tiny.tokenizer import ENDOFTEXT, IM_END


class LocalChat:
    """A transformers causal LM behind `chat(messages, *, expect_text=False, **params)` (one request at a time).

    The keys/values of the last system message seen (the policy's ~4.4k-token policy text and tool schemas, the
    same every turn of every episode) are computed once and reused, as a server's prefix cache does and as the
    build's own checks do (`checks.PrefixCache`); the weights must not change while a `LocalChat` serves them."""

    def __init__(self, model: Any, tokenizer: Any, name: str, where: str) -> None:
        self.model, self.tokenizer, self.model_name, self.where = model, tokenizer, name, where
        self.stop_id = self.tokenizer.convert_tokens_to_ids(IM_END)
        self.pad_id = self.tokenizer.convert_tokens_to_ids(ENDOFTEXT)
        self._prefix: PrefixCache | None = None

    def _prefix_kwargs(self, messages: list[dict[str, Any]], tools: Any, ids: list[int]) -> dict[str, Any]:
        """`generate`'s cached keys/values of the conversation's system turn, when `ids` starts with it."""
        if not messages or messages[0].get("role") != "system":
            return {}
        if self._prefix is None or not self._prefix.covers(ids):
            head = prompt_ids(self.tokenizer, messages[:1], tools, generation_prompt=False)
            if not extends(ids, head):
                return {}
            self._prefix = PrefixCache(self.model, head)
        return self._prefix.generate_kwargs(ids)

    @classmethod
    def load(cls, model_dir: str | Path, name: str) -> LocalChat:
        """The saved model in `model_dir` (a build's `tiny-policy/` or `tiny-user/`), in eval mode."""
        # deferred: torch and transformers (~3 s)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        return cls(model, AutoTokenizer.from_pretrained(model_dir), name, str(model_dir))

    async def chat(self, messages: list[dict[str, Any]], *, expect_text: bool = False, **params: Any) -> dict[str, Any]:
        """One completion: sampled at `temperature` / `top_p` (greedy at 0), seeded by `seed`, at most
        `max_tokens` tokens, ended by the chat template's end-of-turn token."""
        # deferred: torch (~1 s)
        import torch

        prompt = prompt_ids(self.tokenizer, messages, params.get("tools"))
        ids = torch.tensor([prompt])
        temperature = float(params.get("temperature") or 0.0)
        if params.get("seed") is not None:
            torch.manual_seed(int(params["seed"]))
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_p": float(params.get("top_p") or 1.0), "top_k": None}
            if temperature > 0
            else {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        )
        with torch.no_grad():
            out = self.model.generate(
                ids,
                max_new_tokens=int(1024 if params.get("max_tokens") is None else params["max_tokens"]),
                eos_token_id=self.stop_id,
                pad_token_id=self.pad_id,
                **sampling,
                **self._prefix_kwargs(messages, params.get("tools"), prompt),
            )
        new = out[0, ids.shape[1] :].tolist()
        stopped = bool(new) and new[-1] == self.stop_id
        content = self.tokenizer.decode(new[:-1] if stopped else new, skip_special_tokens=True)
        if expect_text and not content.strip():
            # deferred: httpx via the real client's error type (~0.2 s), only on this rare path
            from longhaul.clients.openai_compat import EndpointError, FaultKind

            # What the real client ends with when a server keeps answering without text (a seeded retry samples
            # the same again): the episode is not scored.
            raise EndpointError(
                f"{self.model_name} ({self.where}, in-process) answered without text",
                kind=FaultKind.EMPTY_REPLY,
                role=self.model_name,
                attempts=1,
            )
        await asyncio.sleep(0)  # let the event loop breathe between turns
        return {
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop" if stopped else "length",
                }
            ],
            "usage": {"prompt_tokens": ids.shape[1], "completion_tokens": len(new)},
        }


def step0_setup(spec: Any) -> dict[str, Any]:
    """What of `spec` the step-0 evaluation reads (`step0_estimate`): its training tasks, samples, seeds, episode
    limits and both models' sampling. A build gated on it keys on these, not on the whole spec."""
    # deferred: the τ² task data behind the split (~0.5 s), read only for a gated build's key
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.limits import EpisodeLimits

    s = spec.spec
    return {
        "train": list(build_split(s.environment.split).train),
        "samples_per_task": s.evaluation.samples_per_task,
        "seeds": list(s.evaluation.seeds),
        "limits": asdict(EpisodeLimits.from_spec(spec)),
        "policy_sampling": s.policy.rollout.validation.model_dump(mode="json"),
        "user_sampling": s.user_simulator.sampling.model_dump(mode="json"),
    }


def step0_estimate(spec: Any, policy: LocalChat, user: LocalChat) -> dict[str, Any]:
    """The step-0 evaluation of `spec` on its training tasks (as its eval stage runs it: its samples, seeds, limits
    and sampling) with `policy` and `user` in-process: {"train_pass1", "c_over_n", "terminations"}. Torch's random
    state is restored afterwards (a warm start in progress keeps its stream)."""
    # deferred: torch (~1 s)
    import torch

    # deferred: the evaluation's clients and the τ² environment (~1 s), only where episodes run
    from longhaul.envs.airline.env import AirlineEnv
    from longhaul.envs.airline.splits import build_split
    from longhaul.envs.airline.tasks import base_db
    from longhaul.envs.limits import EpisodeLimits
    from longhaul.eval.evaluate import EvalPlan, build_eval_agents, evaluate
    from longhaul.eval.metrics import summarize_records

    ev, split = spec.spec.evaluation, build_split(spec.spec.environment.split)
    plan = EvalPlan(task_ids=list(split.train), samples=ev.samples_per_task, seeds=list(ev.seeds))
    agent, customer = build_eval_agents(spec.spec, policy, user)
    base = base_db()
    with torch.random.fork_rng():
        records = asyncio.run(
            evaluate(
                plan,
                policy=agent,
                user=customer,
                limits=EpisodeLimits.from_spec(spec),
                split=split,
                concurrency=1,
                env_factory=lambda: AirlineEnv(base),
            )
        )
    # Summarised as the eval stage summarises (a task with an unscored episode is left out), so the estimate and
    # the demo's figure are the same statistic.
    summary = summarize_records(records, [1], bootstrap=0, confidence=0.95, seed=0)
    return {
        "train_pass1": round((summary.get("pass_hat_k") or {}).get("1") or 0.0, 4),  # no scored task: 0
        "c_over_n": summary["c_over_n"],
        "terminations": summary["terminations"],
    }
