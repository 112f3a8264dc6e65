"""Grader parity with the official τ² evaluator, case by case (issue 14).

Each case of `support.tau2_corpus` is played through longhaul's episode runner (scripted policy and user, the
real environment, tools and grader) and its reward, DB match, communicate result, per-call error flags and (where
τ²'s orchestrator played it) termination reason are compared with what τ²'s `Orchestrator` and
`tau2.evaluator.evaluator.evaluate_simulation` gave for the same script (`data/tau2_expected_rewards.json`,
written by `tests/support/tau2_expectations.py` with the official package; CI needs no τ² install).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from longhaul.envs.airline.env import AirlineEnv
from longhaul.envs.airline.tasks import load_tasks, source_info
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.protocols import ParsedCall, PolicyTurn
from longhaul.envs.runner import run_episode
from longhaul.envs.trajectory import Termination
from longhaul.spec.environment import TAU2_MAX_ERRORS
from support.tau2_corpus import Case, build_corpus

EXPECTED_PATH = Path(__file__).parent / "data" / "tau2_expected_rewards.json"
#: τ²'s termination reasons that longhaul names differently (τ² counts orchestrator steps, longhaul turns).
TAU2_TERMINATION = {"max_steps": Termination.MAX_TURNS}
EXPECTED = json.loads(EXPECTED_PATH.read_text(encoding="utf-8"))
CORPUS = build_corpus([t.raw for t in load_tasks().values()])


class _Policy:
    def __init__(self, case: Case) -> None:
        self.turns = list(case.turns)
        self.i = 0

    async def next_turn(self, messages, tools, max_tokens):
        if self.i >= len(self.turns):
            raise AssertionError("the runner asked for a turn past the end of the script")
        t = self.turns[self.i]
        self.i += 1
        calls = [ParsedCall(c.name, c.arguments, json.dumps(c.arguments)) for c in t.calls]
        return PolicyTurn(t.content, calls, completion_tokens=1)


class _User:
    def __init__(self, case: Case) -> None:
        self.replies = [case.opening, *(t.reply for t in case.turns if t.to_user and t.reply is not None)]
        self.i = 0

    async def reply(self, task, conversation):
        r = self.replies[self.i]
        self.i += 1
        return r


async def play(case: Case, env: AirlineEnv):
    limits = EpisodeLimits(max_turns=case.max_turns, transfer_ends_episode=case.transfer_ends_episode)
    task = load_tasks()[case.task_id]
    return await run_episode(env, task, _Policy(case), _User(case), limits)


def test_expectations_were_computed_by_the_pinned_official_code_on_the_same_data():
    assert EXPECTED["tau2_commit"] == source_info()["source_version"].removeprefix("git:")
    pinned = source_info()["sha256"]
    for name, digest in EXPECTED["data_sha256"].items():
        assert pinned[name] == digest, name
    assert "evaluate_simulation" in EXPECTED["evaluator"]


def test_corpus_is_large_varied_and_matches_the_recorded_scripts():
    assert len(CORPUS) >= 300
    cats = Counter(c.category for c in CORPUS)
    for needed in (
        "gold",
        "gold_silent",
        "empty",
        "wrong_type",
        "extra_arg",
        "missing_arg",
        "reordered",
        "partial",
        "foreign",
        "transfer_mid",
        "transfer_mid_tau1",
        "communicate",
        "premature",
        "errors_at_limit",
        "errors_below_limit",
    ):
        assert cats[needed] > 0, needed
    expected = EXPECTED["cases"]
    assert sorted(expected) == sorted(c.id for c in CORPUS), "corpus and expectations differ: rebuild the expectations"
    stale = [c.id for c in CORPUS if expected[c.id]["fp"] != c.fingerprint()]
    assert stale == [], f"scripts changed since the expectations were computed (rebuild them): {stale[:5]}"
    # The official evaluator says both: the corpus is not all-pass or all-fail.
    rewards = Counter(v["reward"] for v in expected.values())
    assert rewards[1.0] > 100 and rewards[0.0] > 100
    # τ²'s orchestrator ended every at-limit case as too_many_errors and none of the others.
    ended = {c.id: expected[c.id]["termination"] for c in CORPUS if c.category.startswith("errors_")}
    assert {ended[c.id] for c in CORPUS if c.category == "errors_at_limit"} == {"too_many_errors"}
    assert "too_many_errors" not in {ended[c.id] for c in CORPUS if c.category == "errors_below_limit"}
    assert Counter(v["termination"] for v in expected.values())["too_many_errors"] == cats["errors_at_limit"]


async def test_every_case_scores_as_the_official_evaluator():
    env = AirlineEnv()
    mismatches = []
    for case in CORPUS:
        want = EXPECTED["cases"][case.id]
        traj = await play(case, env)
        g = traj.grade
        errors = "".join("1" if c.is_error else "0" for t in traj.turns for c in t.tool_calls)
        got = {"reward": g.reward, "errors": errors}
        exp = {"reward": want["reward"], "errors": want["errors"]}
        if want["termination"] is not None:  # τ²'s orchestrator decided how it ended
            got["termination"] = traj.termination
            exp["termination"] = str(TAU2_TERMINATION.get(want["termination"], want["termination"]))
        if want["db"] is not None:  # graded on its merits (τ² does not grade a premature end)
            got.update(db=g.db_match, communicate=g.communicated)
            exp.update(db=want["db"], communicate=want["communicate"])
        else:
            assert traj.aborted, case.id
        if got != exp:
            mismatches.append(f"{case.id}: longhaul {got} vs τ² {exp}")
    assert mismatches == [], f"{len(mismatches)}/{len(CORPUS)} disagree:\n" + "\n".join(mismatches[:20])


@pytest.mark.parametrize(
    ("case_id", "termination", "reward"),
    [
        ("errors/at_limit/7", Termination.TOO_MANY_ERRORS, 0.0),  # the gold after the 10th error never runs
        ("errors/below_limit/7", Termination.USER_STOP, 1.0),
        ("errors/at_limit_after_gold/7", Termination.TOO_MANY_ERRORS, 0.0),  # DB matches, still 0
        ("errors/batch_crossing/7", Termination.TOO_MANY_ERRORS, 0.0),
        ("errors/at_limit_last_turn/7", Termination.TOO_MANY_ERRORS, 0.0),  # wins over max_turns, as in τ²
    ],
)
async def test_the_error_limit_ends_the_episode_where_tau2_does(case_id, termination, reward):
    case = next(c for c in CORPUS if c.id == case_id)
    env = AirlineEnv()
    traj = await play(case, env)
    assert (traj.termination, traj.grade.reward, env.grade_computations) == (termination, reward, 1)
    errors = sum(c.is_error for t in traj.turns for c in t.tool_calls)
    assert traj.num_tool_errors == errors
    if termination == Termination.TOO_MANY_ERRORS:
        assert traj.aborted and errors >= TAU2_MAX_ERRORS
        # The turn that reached the limit ran to its end; nothing after it (no further turn, no user reply).
        assert (
            traj.turns[-1].tool_calls
            and sum(c.is_error for t in traj.turns[:-1] for c in t.tool_calls) < TAU2_MAX_ERRORS
        )
        assert traj.messages[-1]["role"] == "tool"
    if case_id == "errors/at_limit_after_gold/7":
        assert traj.grade.db_match and traj.grade.communicated is False  # the closing message was never sent


@pytest.mark.parametrize("case_id", ["transfer_mid_tau1/7", "transfer_end_tau1/14"])
async def test_tau1_option_ends_on_the_transfer(case_id):
    case = next(c for c in CORPUS if c.id == case_id)
    traj = await play(case, AirlineEnv())
    assert traj.termination == Termination.TRANSFER and not traj.aborted
    assert traj.turns[-1].tool_calls[-1].name == "transfer_to_human_agents"


def test_the_stdlib_corpus_names_the_same_tools_as_the_environment():
    """tests/support/tau2_corpus.py is stdlib-only (it also runs in the scratch venv holding the official package),
    so it restates the write and transfer tools: they must stay the environment's."""
    from longhaul.envs.airline import toolnames
    from support import tau2_corpus

    assert tau2_corpus.WRITE_TOOLS == toolnames.WRITE_TOOLS
    assert tau2_corpus.TRANSFER_TOOL in toolnames.TOOL_NAMES
    assert tau2_corpus.MAX_ERRORS == TAU2_MAX_ERRORS == EpisodeLimits().max_tool_errors
