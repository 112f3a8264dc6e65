"""The shared episode runner with in-process scripted policies and users (no network)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from longhaul.envs.airline.env import AirlineEnv
from longhaul.envs.airline.tasks import get_task, policy_text
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.prompt import build_system_prompt, limit_tool_output, tool_schemas
from longhaul.envs.protocols import ContextOverflowError, ParsedCall, Policy, PolicyTurn, UserSimulator
from longhaul.envs.runner import run_episode
from longhaul.envs.trajectory import Termination, Trajectory
from longhaul.spec.environment import TAU2_MAX_ERRORS


class ScriptPolicy:
    """Plays a list of PolicyTurns (the last one repeats) and records what it was shown."""

    def __init__(self, turns: list[PolicyTurn]) -> None:
        self.turns = turns
        self.calls: list[list[dict]] = []
        self.max_tokens: list[int] = []

    async def next_turn(self, messages, tools, max_tokens):
        self.calls.append(messages)
        self.max_tokens.append(max_tokens)
        i = min(len(self.calls) - 1, len(self.turns) - 1)
        return self.turns[i]


class ScriptUser:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.seen: list[list[dict]] = []

    async def reply(self, task, conversation):
        self.seen.append(conversation)
        return self.replies[min(len(self.seen) - 1, len(self.replies) - 1)]


def call(name: str, args: dict | None = None, raw: str | None = None, err: str | None = None) -> PolicyTurn:
    if args is None and err is None:
        args = {}
    raw = raw if raw is not None else json.dumps(args)
    return PolicyTurn("", [ParsedCall(name, args, raw, err)], completion_tokens=10)


def say(text: str, tokens: int = 5, prompt_tokens: int | None = None) -> PolicyTurn:
    return PolicyTurn(text, [], completion_tokens=tokens, prompt_tokens=prompt_tokens)


LIMITS = EpisodeLimits(max_turns=10, date_line="The current date is 2024-05-15 (Wednesday).")


def test_protocols_are_satisfied_by_plain_classes():
    assert isinstance(ScriptPolicy([]), Policy)
    assert isinstance(ScriptUser([]), UserSimulator)


async def test_gold_episode_prompt_transcript_and_grade():
    task = get_task("5")
    gold = [call(a.name, dict(a.arguments)) for a in task.actions]
    policy = ScriptPolicy([*gold, say("Done, anything else?")])
    user = ScriptUser(["Hi, I want to check my booking.", "No, thanks. ###STOP###"])
    seen: list[dict] = []
    traj = await run_episode(AirlineEnv, task, policy, user, LIMITS, trial=2, seed=7, on_message=seen.append)
    assert traj.termination == Termination.USER_STOP and traj.outcome == 1.0
    assert traj.trial == 2 and traj.seed == 7 and traj.task_id == "5"
    # The system prompt carries the whole policy text and the date line; the first user message follows it.
    sys_msg, first = traj.messages[0], traj.messages[1]
    assert sys_msg["role"] == "system" and policy_text().strip() in sys_msg["content"]
    assert LIMITS.date_line in sys_msg["content"]
    assert first == {"role": "user", "content": "Hi, I want to check my booking."}
    assert policy.calls[0] == traj.messages[:2]
    assert seen == traj.messages  # on_message saw every appended message, in order
    assert [t.to_user for t in traj.turns] == [False] * len(gold) + [True]
    assert traj.num_tool_calls == len(gold) and traj.num_tool_errors == 0
    assert traj.messages[-1] == {"role": "user", "content": "No, thanks. ###STOP###"}
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert len(tool_msgs) == len(gold) and all(m["tool_call_id"] for m in tool_msgs)
    # The user simulator sees only text, from the agent's point of view.
    assert user.seen[0] == [] and user.seen[1][-1] == {"role": "assistant", "content": "Done, anything else?"}
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj and again.outcome == 1.0
    # A policy that reports no weights version (an OpenAI endpoint) leaves the runner's records as they were.
    assert all("policy_version" not in t for t in traj.to_dict()["turns"])


async def test_turns_keep_the_policy_version_their_policy_reports():
    """veRL's rollout reports the weights version of each generation (two for one resumed after an asynchronous
    trainer's weight update): the runner records it per turn, and it survives the JSON round trip."""
    task = get_task("5")
    gold = [call(a.name, dict(a.arguments)) for a in task.actions]

    class VersionedPolicy(ScriptPolicy):
        async def next_turn(self, messages, tools, max_tokens):
            pt = await super().next_turn(messages, tools, max_tokens)
            k = len(self.calls) - 1
            return dataclasses.replace(pt, policy_version=(3, 3) if k == 0 else (3, 4))

    policy = VersionedPolicy([*gold, say("Done, anything else?")])
    user = ScriptUser(["Hi, I want to check my booking.", "No, thanks. ###STOP###"])
    traj = await run_episode(AirlineEnv, task, policy, user, LIMITS, trial=0, seed=1)
    assert [t.policy_version for t in traj.turns] == [(3, 3)] + [(3, 4)] * len(gold)
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj and traj.to_dict()["turns"][1]["policy_version"] == [3, 4]


TAU1 = EpisodeLimits(max_turns=10, date_line=LIMITS.date_line, transfer_ends_episode=True)


async def test_transfer_then_stop_regression_through_the_runner():
    """τ-bench 1's rule (transfer_ends_episode): the runner stops at the transfer, the user is never asked again,
    the policy is not called again, and the wrong write before the transfer stays graded 0 (method.md c.3)."""
    task = get_task("0")
    policy = ScriptPolicy(
        [
            call("cancel_reservation", {"reservation_id": "EHGLP3"}),
            call("transfer_to_human_agents", {"summary": "refund"}),
            say("###STOP###"),
        ]
    )
    user = ScriptUser(["Cancel EHGLP3 please.", "###STOP###"])
    traj = await run_episode(AirlineEnv, task, policy, user, TAU1)
    assert traj.termination == Termination.TRANSFER
    assert len(policy.calls) == 2 and len(user.seen) == 1
    assert traj.outcome == 0.0 and not traj.grade.db_match


async def test_transfer_goes_on_until_the_user_stops_like_tau2():
    """Default (τ²): the transfer is an ordinary tool; the agent tells the user, the user simulator says
    ###TRANSFER### and that ends the episode (user_stop), graded once."""
    task = get_task("13")  # its gold action is the transfer
    policy = ScriptPolicy(
        [
            call("transfer_to_human_agents", {"summary": "needs a human"}),
            say("I have transferred you to a human agent."),
        ]
    )
    user = ScriptUser(["Hello", "###TRANSFER###"])
    traj = await run_episode(AirlineEnv, task, policy, user, LIMITS)
    assert traj.termination == Termination.USER_STOP and traj.outcome == 1.0 and not traj.aborted
    assert len(policy.calls) == 2 and len(user.seen) == 2


async def test_writes_after_a_transfer_count_like_tau2():
    policy = ScriptPolicy(
        [
            call("transfer_to_human_agents", {"summary": "refund"}),
            call("cancel_reservation", {"reservation_id": "EHGLP3"}),
            say("Done."),
        ]
    )
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi", "###TRANSFER###"]), LIMITS)
    assert traj.termination == Termination.USER_STOP and not traj.grade.db_match and traj.outcome == 0.0


async def test_transfer_with_correct_database_is_graded_normally_under_the_tau1_rule():
    task = get_task("13")
    policy = ScriptPolicy([call("transfer_to_human_agents", {"summary": "needs a human"})])
    traj = await run_episode(AirlineEnv, task, policy, ScriptUser(["Hello"]), TAU1)
    assert traj.termination == Termination.TRANSFER and traj.outcome == 1.0 and not traj.aborted


async def test_agent_stop_ends_without_asking_the_user():
    policy = ScriptPolicy([say("Goodbye. ###STOP###")])
    user = ScriptUser(["Hello"])
    traj = await run_episode(AirlineEnv(), get_task("0"), policy, user, LIMITS)
    assert traj.termination == Termination.AGENT_STOP and len(user.seen) == 1 and traj.outcome == 1.0


async def test_calls_after_a_terminal_call_in_the_same_turn_are_not_executed():
    turn = PolicyTurn(
        "",
        [
            ParsedCall("transfer_to_human_agents", {"summary": "x"}, '{"summary": "x"}'),
            ParsedCall("cancel_reservation", {"reservation_id": "EHGLP3"}, "{}"),
        ],
    )
    traj = await run_episode(AirlineEnv, get_task("0"), ScriptPolicy([turn]), ScriptUser(["Hi"]), TAU1)
    assert [c.name for c in traj.turns[0].tool_calls] == ["transfer_to_human_agents"]
    assert traj.outcome == 1.0
    # τ²: the same turn runs to its end (the cancellation counts).
    traj = await run_episode(
        AirlineEnv, get_task("0"), ScriptPolicy([turn, say("Done.")]), ScriptUser(["Hi", "###STOP###"]), LIMITS
    )
    assert [c.name for c in traj.turns[0].tool_calls] == ["transfer_to_human_agents", "cancel_reservation"]
    assert traj.termination == Termination.USER_STOP and traj.outcome == 0.0


async def test_max_turns_is_premature_and_scores_0_even_when_the_database_matches():
    policy = ScriptPolicy([call("get_user_details", {"user_id": "emma_kim_9957"})])
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_turns=3))
    assert traj.termination == Termination.MAX_TURNS and len(traj.turns) == 3
    assert traj.grade.db_match and traj.outcome == 0.0 and traj.aborted


async def test_repeated_calls_abort_as_loop():
    policy = ScriptPolicy([call("get_user_details", {"user_id": "emma_kim_9957"})])
    traj = await run_episode(
        AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_turns=30, abort_repeated_calls=3)
    )
    assert traj.termination == Termination.LOOP and len(traj.turns) == 3 and traj.outcome == 0.0


async def test_malformed_tool_json_is_an_error_observation_for_that_turn():
    policy = ScriptPolicy(
        [
            call("get_user_details", None, raw='{"user_id": ', err="invalid JSON"),
            call("nonexistent_tool", {"a": 1}),
            say("Sorry, all good. ###STOP###"),
        ]
    )
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), LIMITS)
    first, second = traj.turns[0].tool_calls[0], traj.turns[1].tool_calls[0]
    assert first.is_error and first.parse_error == "invalid JSON" and first.raw_arguments == '{"user_id": '
    assert second.is_error and not second.known_tool
    assert traj.num_tool_errors == 2 and traj.num_unknown_tool_calls == 1
    assert traj.termination == Termination.AGENT_STOP and traj.outcome == 1.0
    assert traj.messages[3]["content"].startswith("Error:")


async def test_tool_errors_up_to_the_limit_end_the_episode_as_too_many_errors():
    """τ²'s orchestrator: every error observation counts, over the whole episode; at the limit the episode ends
    (too_many_errors, premature: 0) before the policy or the user is asked again, graded exactly once."""
    env = AirlineEnv()
    policy = ScriptPolicy(
        [
            call("get_user_details", {"user_id": "nobody_0000"}),  # not found
            say("Let me try again."),  # a message to the user does not reset the count
            call("update_user_profile", {"user_id": "emma_kim_9957"}),  # unknown tool
            call("get_user_details", None, raw='{"user_id": ', err="invalid JSON"),  # unparsable arguments
            say("unused: the episode ended"),
        ]
    )
    user = ScriptUser(["Hi", "Sure."])
    traj = await run_episode(env, get_task("0"), policy, user, EpisodeLimits(max_tool_errors=3))
    assert traj.termination == Termination.TOO_MANY_ERRORS and traj.aborted and traj.outcome == 0.0
    assert len(policy.calls) == 4 and len(user.seen) == 2 and traj.messages[-1]["role"] == "tool"
    assert traj.num_tool_errors == 3 and env.grade_computations == 1 and traj.grade.details["premature"]
    # The database matches (nothing was written) and the task needs nothing said: still 0, as in τ².
    assert traj.grade.db_match and traj.grade.communicated


async def test_one_error_below_the_limit_is_graded_on_its_merits():
    policy = ScriptPolicy([call("get_user_details", {"user_id": "nobody_0000"})] * 2 + [say("Done. ###STOP###")])
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_tool_errors=3))
    assert traj.termination == Termination.AGENT_STOP and traj.num_tool_errors == 2 and traj.outcome == 1.0


async def test_the_limit_is_checked_after_the_whole_turn_like_tau2():
    """τ² executes every call of the message that reaches the limit, then ends the episode."""
    bad = ParsedCall("get_reservation_details", {"reservation_id": "ZZZZZZ"}, '{"reservation_id": "ZZZZZZ"}')
    ok = ParsedCall("get_user_details", {"user_id": "emma_kim_9957"}, '{"user_id": "emma_kim_9957"}')
    policy = ScriptPolicy([PolicyTurn("", [bad, bad, ok, bad]), say("unused")])
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_tool_errors=2))
    assert [c.is_error for c in traj.turns[0].tool_calls] == [True, True, False, True]
    assert traj.termination == Termination.TOO_MANY_ERRORS and len(policy.calls) == 1
    # An earlier terminal event of the same turn stays the first one (τ-bench 1's transfer).
    transfer = ParsedCall("transfer_to_human_agents", {"summary": "x"}, '{"summary": "x"}')
    policy = ScriptPolicy([PolicyTurn("", [bad, bad, transfer, bad])])
    tau1 = EpisodeLimits(max_tool_errors=2, transfer_ends_episode=True)
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), tau1)
    assert traj.termination == Termination.TRANSFER and len(traj.turns[0].tool_calls) == 3


async def test_no_error_limit_when_max_tool_errors_is_null():
    policy = ScriptPolicy([call("nonexistent_tool")] * 25 + [say("###STOP###")])
    traj = await run_episode(
        AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_turns=30, max_tool_errors=None)
    )
    assert traj.termination == Termination.AGENT_STOP and traj.num_tool_errors == 25
    # τ²'s default limit would have ended it at the 10th error.
    traj = await run_episode(
        AirlineEnv, get_task("0"), ScriptPolicy(policy.turns), ScriptUser(["Hi"]), EpisodeLimits(max_turns=30)
    )
    assert traj.termination == Termination.TOO_MANY_ERRORS and traj.num_tool_errors == 10 == TAU2_MAX_ERRORS


async def test_tool_output_limit_applies_to_what_the_policy_sees():
    policy = ScriptPolicy([call("list_all_airports"), say("###STOP###")])
    traj = await run_episode(
        AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(tool_output_limit=120)
    )
    shown = traj.turns[0].tool_calls[0].result
    assert len(shown) <= 120 and "truncated" in shown
    assert traj.messages[3]["content"] == shown


def test_limit_tool_output():
    assert limit_tool_output("abc", None) == "abc"
    assert limit_tool_output("abc", 3) == "abc"
    cut = limit_tool_output("x" * 1000, 100)
    assert len(cut) == 100 and cut.endswith("chars]")
    assert limit_tool_output("x" * 1000, 5) == "xxxxx"


async def test_empty_turn_is_a_policy_format_error():
    traj = await run_episode(AirlineEnv, get_task("0"), ScriptPolicy([say("  ")]), ScriptUser(["Hi"]), LIMITS)
    assert traj.termination == Termination.POLICY_FORMAT_ERROR and traj.outcome == 0.0


async def test_context_overflow_ends_the_episode():
    class Overflow:
        async def next_turn(self, messages, tools, max_tokens):
            raise ContextOverflowError("too long")

    traj = await run_episode(AirlineEnv, get_task("0"), Overflow(), ScriptUser(["Hi"]), LIMITS)
    assert traj.termination == Termination.CONTEXT_OVERFLOW and traj.outcome == 0.0


async def test_response_token_budget_counts_tool_and_user_tokens_when_the_policy_reports_prompt_tokens():
    # prompt grows 1000 → 1600 → 2300: by turn 3 the response (prompt growth + completion) reaches 1500.
    turns = [say("a", 100, prompt_tokens=1000), say("b", 100, prompt_tokens=1600), say("c", 100, prompt_tokens=2300)]
    policy = ScriptPolicy(turns)
    traj = await run_episode(
        AirlineEnv, get_task("0"), policy, ScriptUser(["Hi", "more", "more"]), EpisodeLimits(max_response_tokens=1400)
    )
    assert traj.termination == Termination.MAX_TOKENS and len(traj.turns) == 3
    assert traj.metadata["response_tokens"] == 1400


async def test_prompt_over_max_prompt_tokens_is_an_overflow():
    policy = ScriptPolicy([say("hello", prompt_tokens=9000)])
    traj = await run_episode(
        AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_prompt_tokens=8192)
    )
    assert traj.termination == Termination.CONTEXT_OVERFLOW


async def test_per_turn_token_cap_is_passed_to_the_policy():
    policy = ScriptPolicy([say("###STOP###")])
    await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["Hi"]), EpisodeLimits(max_tokens_per_turn=321))
    assert policy.max_tokens == [321]


async def test_endpoint_failures_propagate_instead_of_scoring_zero():
    class Broken:
        async def next_turn(self, messages, tools, max_tokens):
            raise RuntimeError("policy endpoint down")

    with pytest.raises(RuntimeError, match="endpoint down"):
        await run_episode(AirlineEnv, get_task("0"), Broken(), ScriptUser(["Hi"]), LIMITS)


async def test_user_stop_in_the_first_message():
    policy = ScriptPolicy([say("unused")])
    traj = await run_episode(AirlineEnv, get_task("0"), policy, ScriptUser(["###STOP###"]), LIMITS)
    assert traj.termination == Termination.USER_STOP and policy.calls == [] and traj.turns == []


def test_limits_from_spec_and_prompt_helpers():
    from longhaul.spec.environment import EnvironmentSpec
    from longhaul.spec.models import ExperimentSpec

    spec = ExperimentSpec(environment=EnvironmentSpec(max_turns=7, tool_output_limit=500, abort_repeated_calls=4))
    lim = EpisodeLimits.from_spec(spec)
    assert (lim.max_turns, lim.tool_output_limit, lim.abort_repeated_calls) == (7, 500, 4)
    assert lim.transfer_ends_episode is False and EpisodeLimits().transfer_ends_episode is False  # τ² by default
    tau1 = ExperimentSpec(environment=EnvironmentSpec(transfer_ends_episode=True))
    assert EpisodeLimits.from_spec(tau1).transfer_ends_episode is True
    assert lim.max_tool_errors == EpisodeLimits().max_tool_errors == TAU2_MAX_ERRORS == 10  # τ²'s limit by default
    unlimited = ExperimentSpec(environment=EnvironmentSpec(max_tool_errors=None))
    assert EpisodeLimits.from_spec(unlimited).max_tool_errors is None
    assert lim.max_tokens_per_turn == spec.environment.max_tokens_per_turn
    assert lim.date_line == spec.environment.date_line
    prompt = build_system_prompt("POLICY BODY", "The date is X.")
    assert "POLICY BODY" in prompt and prompt.rstrip().endswith("The date is X.")
    names = [t["function"]["name"] for t in tool_schemas()]
    assert len(names) == 14 and len(set(names)) == 14
