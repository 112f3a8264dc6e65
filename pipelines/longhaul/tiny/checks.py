"""The tiny build's own evaluation: held-out checks of both models, and the criteria a build must meet.

The policy is checked on held-out tasks at the two decisions the demo turns on: opening with a well-formed tool
call, and ending the conversation once the work is done. Besides greedy generations, the checks read the
*probability* of each decision at the demo's rollout temperature (`CHECK_TEMPERATURE`) from the next-token
distribution: a smooth figure that says how far a behaviour is from flipping, where a greedy count only says
which side of the edge it is on. The user simulator is checked with greedy replies (`judge_simulator_replies`).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

from longhaul.tiny.gold import parse_tool_calls
from longhaul.tiny.simulator import judge_simulator_replies
from longhaul.tiny.tokenizer import ENDOFTEXT, IM_END
from longhaul.tiny.warmstart import encode_prefix, shared_prefix

#: Sampling temperature the decision probabilities are read at: the demo's rollout temperature
#: (specs/demo.yaml `policy.rollout.train.temperature`; a unit test keeps the two equal).
CHECK_TEMPERATURE = 0.3
TOOL_CALL_TOKEN = "<tool_call>"
#: The criterion read from greedy generations (the slow check).
GREEDY_CRITERION = "first_turn_well_formed"
#: Where P(close instead of another call) must be after the warm start.
CLOSE_BAND = (0.25, 0.55)
#: Where the demo's step-0 pass^1 on its training tasks, estimated by the build (`longhaul.tiny.local_chat`), must
#: be: what `make demo` starts from on any machine (the criteria above did not pin it: one build met them all and
#: started the demo at 2/48, its estimate 0/48; the project's build started at 21/48, its estimates 13-20/48).
#: The top is the README's step 0 (0.438) + 0.15, #31's window: at 0.55 an AVX-512 AMD EPYC's build estimated
#: 28/48 (0.583) at its first check that met every other criterion, never came back under 0.55 (0.77-0.85 from
#: step 1200) and was refused at step 1600, failing CI's set-up there.
STEP0_BAND = (0.25, 0.59)
STEP0_CRITERION = "demo_step0_train_pass1"


@dataclass(frozen=True)
class Criterion:
    """One measured property of a build and the range it must fall in."""

    name: str
    value: float
    low: float
    high: float = 1.0
    what: str = ""

    @property
    def met(self) -> bool:
        return self.low <= self.value <= self.high

    def line(self) -> str:
        """`name  value  in [low, high]  ok/NOT MET  what` for the build log."""
        bounds = f">= {self.low:.2f}" if self.high >= 1.0 else f"in [{self.low:.2f}, {self.high:.2f}]"
        return f"{self.name:<28} {self.value:6.3f}  {bounds:<16} {'ok' if self.met else 'NOT MET'}  {self.what}"


def complete(
    model: Any,
    tokenizer: Any,
    messages: list,
    tools: list | None,
    *,
    sample: bool,
    max_new_tokens: int,
    prefix: PrefixCache | None = None,
) -> str:
    """One assistant turn generated with transformers (greedy, or sampled at temperature 1), special tokens kept;
    with `prefix`, the shared system prompt's keys/values are reused instead of recomputed."""
    # deferred: torch (~1 s)
    import torch

    ids = torch.tensor([prompt_ids(tokenizer, messages, tools)])
    kwargs = prefix.generate_kwargs(ids[0].tolist()) if prefix is not None else {}
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=1.0 if sample else None,
            top_p=None,
            top_k=None,
            eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
            pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
            **kwargs,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


def prompt_ids(tokenizer: Any, messages: list, tools: list | None, *, generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` rendered with the generation prompt (what a server would feed the model), or
    without it (a conversation's head)."""
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def extends(ids: list[int], prefix: list[int]) -> bool:
    """Whether `ids` starts with `prefix` and goes on past it (a prompt a cache of `prefix` can serve)."""
    return len(ids) > len(prefix) and ids[: len(prefix)] == prefix


class PrefixCache:
    """Keys/values of a token prefix that many check prompts share (the ~4.4k-token system prompt), computed once.

    Every use works on a copy, so the prompts stay independent; the results equal a full forward up to rounding.
    """

    def __init__(self, model: Any, prefix_ids: list[int]) -> None:
        self.ids = list(prefix_ids)
        self.cache = encode_prefix(model, self.ids)

    def covers(self, ids: list[int]) -> bool:
        return extends(ids, self.ids)

    def generate_kwargs(self, ids: list[int]) -> dict[str, Any]:
        """`past_key_values` for `generate` when `ids` starts with the prefix (else nothing)."""
        return {"past_key_values": copy.deepcopy(self.cache)} if self.covers(ids) else {}

    def last_logits(self, model: Any, ids: list[int]) -> Any:
        """Logits of the next token after `ids` (only the tokens past the prefix are run)."""

        # deferred: torch (~1 s)
        import torch

        with torch.no_grad():
            if not self.covers(ids):
                return model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
            n = len(self.ids)
            out = model(
                input_ids=torch.tensor([ids[n:]]),
                past_key_values=copy.deepcopy(self.cache),
                position_ids=torch.arange(n, len(ids)).unsqueeze(0),
                use_cache=True,
                logits_to_keep=1,
            )
            return out.logits[0, -1]


def tool_call_probability(model: Any, tokenizer: Any, ids: list[int], prefix: PrefixCache, temperature: float) -> float:
    """P(the next assistant turn opens with `<tool_call>`) after prompt `ids`, sampling at `temperature`."""
    # deferred: torch (~1 s)
    import torch

    logits = prefix.last_logits(model, ids).double()
    probs = torch.softmax(logits / temperature, dim=-1)
    return float(probs[tokenizer.convert_tokens_to_ids(TOOL_CALL_TOKEN)])


def check_policy(model: Any, tokenizer: Any, inputs: dict[str, Any], *, prompts: int) -> dict[str, Any]:
    """Held-out checks of the policy: greedy first turns on `prompts` tasks (well-formed tool calls), and the mean
    probability at `CHECK_TEMPERATURE` of opening with a tool call (first turns) and of closing instead (after the
    reference actions) on every held-out task."""
    tools = inputs["tools"]
    names = [t["function"]["name"] for t in tools]
    first = [prompt_ids(tokenizer, m, tools) for m in inputs["held_prompts"]]
    closings = [prompt_ids(tokenizer, m, tools) for m in inputs["held_closings"]]
    prefix = PrefixCache(model, shared_prefix(first + closings))
    p_open = [tool_call_probability(model, tokenizer, ids, prefix, CHECK_TEMPERATURE) for ids in first]
    p_close = [1.0 - tool_call_probability(model, tokenizer, ids, prefix, CHECK_TEMPERATURE) for ids in closings]
    good = total = with_call = 0
    for messages in inputs["held_prompts"][:prompts]:
        completion = complete(model, tokenizer, messages, tools, sample=False, max_new_tokens=96, prefix=prefix)
        g, n = parse_tool_calls(completion, names)
        good, total, with_call = good + g, total + n, with_call + (1 if n else 0)
    return {
        "greedy": {
            "prompts": min(prompts, len(first)),
            "with_tool_call": with_call,
            "well_formed": good,
            "blocks": total,
        },
        "temperature": CHECK_TEMPERATURE,
        "p_tool_call_first_turn": round(sum(p_open) / len(p_open), 4),
        "p_close_after_actions": round(sum(p_close) / len(p_close), 4),
        "first_turns": len(p_open),
        "closings": len(p_close),
        "shared_prefix_tokens": len(prefix.ids),
    }


def check_user(model: Any, tokenizer: Any, checks: list, *, max_new_tokens: int = 24) -> dict[str, Any]:
    """Greedy replies of the simulator on held-out tasks, judged by `judge_simulator_replies`: counts per
    criterion, the stop rate after the agent's closing message, and the first opening as an example."""
    counts: dict[str, int] = {}
    example = ""
    for _tid, user_id, prompts in checks:
        replies = {
            k: complete(model, tokenizer, m, None, sample=False, max_new_tokens=max_new_tokens)
            for k, m in prompts.items()
        }
        example = example or replies["opening"]
        for k, ok in judge_simulator_replies(replies, user_id).items():
            counts[k] = counts.get(k, 0) + int(ok)
    n = len(checks)
    return {
        "tasks": n,
        **counts,
        "stop_rate": round(counts.get("stop_after_closing", 0) / n, 3) if n else 0.0,
        "example_opening": example,
    }


def criteria(tool_calls: dict[str, Any], user_check: dict[str, Any]) -> list[Criterion]:
    """The build's criteria from its checks (a skipped check contributes none)."""
    out: list[Criterion] = []
    if tool_calls:
        greedy = tool_calls["greedy"]
        out += [
            Criterion(
                GREEDY_CRITERION,
                greedy["well_formed"] / max(1, greedy["prompts"]),
                0.8,
                what="held-out first turns (greedy) with a well-formed tool call",
            ),
            Criterion(
                "p_tool_call_first_turn",
                tool_calls["p_tool_call_first_turn"],
                0.9,
                what=f"P(opens with a tool call) at T={CHECK_TEMPERATURE}, held-out first turns",
            ),
            # A band, not a floor: the demo needs a policy that sometimes ends the conversation and has room to
            # learn to do it always. A narrow one: where the warm start stops in it sets the demo's step 0
            # (`longhaul.tiny.gate`; P(close) climbs through it in the second half of the warm start).
            Criterion(
                "p_close_after_actions",
                tool_calls["p_close_after_actions"],
                CLOSE_BAND[0],
                CLOSE_BAND[1],
                what=f"P(closes instead of another call) at T={CHECK_TEMPERATURE}, held-out tasks after their actions",
            ),
        ]
    step0 = (tool_calls or {}).get("step0")
    if step0:
        out.append(
            Criterion(
                STEP0_CRITERION,
                step0["train_pass1"],
                STEP0_BAND[0],
                STEP0_BAND[1],
                what=f"the demo's step-0 pass^1 on its training tasks, in-process ({step0['c_over_n']})",
            )
        )
    if user_check:
        n = max(1, user_check["tasks"])
        for key, what in (
            ("request_first", "held-out openings that state a request"),
            ("stop_after_closing", "###STOP### after the agent's closing message"),
            ("transfer_after_transfer", "###TRANSFER### after a transfer"),
        ):
            out.append(Criterion(f"user_{key}", user_check.get(key, 0) / n, 0.9, what=what))
    return out


def criteria_report(items: list[Criterion]) -> list[dict[str, Any]]:
    """JSON form of the criteria for the build report."""
    return [{**asdict(c), "met": c.met} for c in items]
