"""Everything the tiny build reads, computed from the τ² airline tasks: the tokenizer corpus, the warm-start
conversations of both models, and the held-out prompts the build's criteria are measured on.

The test tasks of both split presets (the seed's unseen 10 and τ²'s official 20) never reach a warm start, so no
shipped spec evaluates a tiny model on a task it was trained on; the held-out checks use exactly those tasks.
"""

from __future__ import annotations

import json
import random
from typing import Any

from longhaul.envs.airline.env import AirlineEnv, ToolAction
from longhaul.envs.airline.splits import build_split
from longhaul.envs.airline.tasks import load_tasks, policy_text
from longhaul.envs.prompt import build_initial_messages, tool_schemas
from longhaul.spec.environment import EnvironmentSpec
from longhaul.tiny.gold import (
    build_first_turn,
    build_gold_conversation,
    closing_message,
    first_user_message,
    gold_actions,
    opening_variants,
)
from longhaul.tiny.simulator import simulator_check_prompts, simulator_conversations, user_facts

#: Tool results are cut to this many characters in warm-start conversations (they carry no labels).
WARMSTART_TOOL_RESULT_CHARS = 1200


def default_date_line() -> str:
    """The spec's default date line (the prompt every shipped spec renders)."""
    return EnvironmentSpec().date_line


def gold_results(task_id: str, actions: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Observations of the reference actions, run in order through the airline environment."""
    env = AirlineEnv()
    env.reset(task_id)
    out = []
    for i, (name, args) in enumerate(actions):
        res = env.step(ToolAction(name, dict(args), json.dumps(args), f"call_{i}_0"))
        out.append(res.observation)
        if res.done:
            break
    return out


def _gold_conversation(task: Any, policy: str, date_line: str) -> list[dict[str, Any]]:

    raw = task.raw
    results = [r[:WARMSTART_TOOL_RESULT_CHARS] for r in gold_results(task.id, gold_actions(raw))]
    actions = gold_actions(raw)[: len(results)]
    initial = build_initial_messages(policy, date_line, first_user_message(raw))
    return build_gold_conversation(initial, actions, results, closing_message(raw))


def build_inputs(date_line: str) -> dict[str, Any]:
    """The build's inputs: `conversations` (policy warm start), `user_conversations` (simulator warm start),
    `held_prompts` (first turns of held-out tasks), `held_closings` (held-out gold conversations up to the
    closing message: the point where the agent should end the conversation), `user_checks`, `corpus` (tokenizer)
    and `train_task_ids`."""
    tasks = load_tasks()
    held_out = set(build_split("seed_40_10").test) | set(build_split("tau2_official").test)
    train_ids = [tid for tid in tasks if tid not in held_out]
    tools = tool_schemas()
    policy = policy_text()
    rng = random.Random(0)
    noise_words = sorted({w for w in policy.split() if w.isalpha()})
    conversations = []
    for tid in train_ids:
        raw = tasks[tid].raw
        conversation = _gold_conversation(tasks[tid], policy, date_line)
        conversations.append(conversation)
        if len(conversation) > 3:  # at least one reference action
            # Extra first turns (cheap: a short suffix after the shared system prompt) so the policy opens with
            # a tool call whatever the first user message looks like.
            first_action = gold_actions(raw)[0]
            for text in opening_variants(raw, noise_words, rng):
                conversations.append(build_first_turn(build_initial_messages(policy, date_line, text), first_action))
    held_ids = sorted(held_out & set(tasks), key=int)
    held_prompts = [build_initial_messages(policy, date_line, first_user_message(tasks[tid].raw)) for tid in held_ids]
    held_closings = []
    for tid in held_ids:
        conversation = _gold_conversation(tasks[tid], policy, date_line)
        if len(conversation) > 3:
            held_closings.append(conversation[:-1])
    # The user simulator learns from the same training tasks; its own rng keeps the policy's data unchanged.
    user_rng = random.Random(1)
    user_conversations = [
        c
        for tid in train_ids
        for c in simulator_conversations(tasks[tid].raw, tasks[tid].user_instructions(), user_rng)
    ]
    user_checks = [
        (
            tid,
            user_facts(tasks[tid].user_instructions())[0],
            simulator_check_prompts(tasks[tid].raw, tasks[tid].user_instructions()),
        )
        for tid in held_ids
    ]
    corpus = [policy, *(json.dumps(t, ensure_ascii=False) for t in tools)]
    corpus += [json.dumps(t.user_scenario, ensure_ascii=False) for t in tasks.values()]
    corpus += [m["content"] for c in conversations for m in c if m.get("content")]
    corpus += [m["tool_calls"][0]["function"]["arguments"] for c in conversations for m in c if m.get("tool_calls")]
    return {
        "tools": tools,
        "conversations": conversations,
        "held_prompts": held_prompts,
        "held_closings": held_closings,
        "user_conversations": user_conversations,
        "user_checks": user_checks,
        "corpus": corpus,
        "train_task_ids": train_ids,
    }
