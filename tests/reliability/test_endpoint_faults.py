"""Faulty policy and user-simulator endpoints, through the real clients and the episode runner (`evaluate`).

Every fault kind of `support.openai_stub.FAULTS` is injected mid-episode into the policy's and the user
simulator's answers, against the scripted τ² airline server (gold policy, scripted customer):

- **transient** (one faulty answer per episode, `N` episodes per kind and endpoint): the client retries within its
  budget, the evaluation completes, every episode ends as it does without faults (graded on its merits: success).
  A tool call with invalid JSON arguments is the policy's own output: it is not retried but answered with an error
  observation, recorded on the trajectory (`ToolCall.parse_error`), and the episode goes on.
- **persistent** (every try of one request faulty, past the retry budget): the episode ends `endpoint_error`, its
  record says so (`scored: false`, no reward, the endpoint's error and fault class) and it is never graded (never a
  zero reward). A three-trial evaluation allows no such episode (`longhaul.eval.evaluate.UNSCORED_SHARE`): it then
  stops with `PolicyEndpointError`, the episodes finished before keep their records. A twelve-trial one allows
  one: it completes, and the summary leaves that task out of every rate and says so.

Lost ("silent failures") = an episode that ended with a zero it did not earn (a failed grade or a premature
termination where the fault-free run succeeds) or a crash with anything other than the clients' documented errors.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from longhaul.clients.openai_compat import ChatClient, FaultKind, RetryPolicy
from longhaul.clients.policy import OpenAIPolicy
from longhaul.clients.user_simulator import OpenAIUserSimulator
from longhaul.envs.airline.splits import Split
from longhaul.envs.limits import EpisodeLimits
from longhaul.envs.protocols import PolicyEndpointError
from longhaul.eval.evaluate import EvalPlan, evaluate
from longhaul.eval.metrics import TrialRecord, compute_summary
from support.airline_scripts import ScriptedUser, gold_plan
from support.openai_stub import FAULTS, Reply, StubServer

#: Episodes per fault kind and endpoint (transient), and evaluations per kind and endpoint (persistent).
N_TRANSIENT = 3
N_PERSISTENT = 1
#: The retry budget of these tests: 6 tries, 0.02 → 0.15 s between them (0.44 s of waits), 1 s per answer (a
#: loaded machine must not turn a normal answer into a timeout).
RETRY = RetryPolicy(attempts=6, backoff_initial_s=0.02, backoff_max_s=0.15, timeout_s=1.0)
#: How long a `hang` answer is late, and how long a `refuse` fault closes the port (transient: shorter than the
#: waits of the budget; persistent: longer).
HANG_S, REFUSE_S, REFUSE_PERSISTENT_S = 1.2, 0.1, 0.8
#: Gold tasks of one tool call each (two policy and two user-simulator requests per episode), each succeeding
#: without faults.
TASKS = ["5", "6", "9"]
ROLES = {"policy": "policy", "user": "user simulator"}

#: The fault kind the client reports for each injected fault (None: not an endpoint fault).
EXPECTED_KIND = {
    "status": FaultKind.HTTP_5XX,
    "hang": FaultKind.TIMEOUT,
    "truncated_body": FaultKind.CONNECTION_RESET,
    "truncated_json": FaultKind.INVALID_JSON,
    "malformed_json": FaultKind.INVALID_JSON,
    "non_utf8": FaultKind.NON_UTF8,
    "empty_body": FaultKind.INVALID_JSON,
    "empty_choices": FaultKind.EMPTY_CHOICES,
    "null_message": FaultKind.MALFORMED_RESPONSE,
    "bad_tool_calls": FaultKind.MALFORMED_RESPONSE,
    "close": FaultKind.CONNECTION_RESET,
    "reset": FaultKind.CONNECTION_RESET,
    "refuse": FaultKind.CONNECTION_REFUSED,
}


def _policy_faults(role: str) -> dict[str, FaultKind | None]:
    """Fault kinds per injected fault for one endpoint. A policy answer with no text and no tool call, or with
    invalid tool arguments, is the policy's output (None: judged as such, not retried); for the user simulator
    both are faults."""
    kinds: dict[str, FaultKind | None] = dict(EXPECTED_KIND)
    if role == "policy":
        kinds["empty_content"] = None
        kinds["invalid_tool_args"] = None
    else:
        kinds["empty_content"] = FaultKind.EMPTY_REPLY
        kinds["invalid_tool_args"] = FaultKind.EMPTY_REPLY
    assert set(kinds) == set(FAULTS), "a fault kind of the stub is not covered here"
    return kinds


def gold_after_errors(body: dict[str, Any]) -> Reply:
    """The gold plan of the episode's task; an assistant turn answered by a tool error is repeated (the next turn
    does what the failed one should have done), so an injected bad tool call costs a turn, not the task."""
    from support.airline_scripts import _tag

    tid, _ = _tag(body)
    msgs = body["messages"]
    done = 0
    for i, m in enumerate(msgs):
        if m.get("role") != "assistant":
            continue
        answered = [r for r in msgs[i + 1 :] if r.get("role") == "tool"][:1]
        if not (m.get("tool_calls") and answered and str(answered[0].get("content", "")).startswith("Error")):
            done += 1
    plan = gold_plan(tid)
    return plan[done] if done < len(plan) else Reply(content="Is there anything else I can help with?")


@pytest.fixture(scope="module")
def server():
    with StubServer({"policy": gold_after_errors, "user": ScriptedUser()}) as srv:
        yield srv


def _split() -> Split:
    return Split(train=list(TASKS), test=[], subsets={"train": list(TASKS)}, name="faults")


async def _evaluate(
    server: StubServer, inject, results: Path, samples: int = 1
) -> tuple[list[dict], list[Any], dict, dict]:
    """One evaluation of TASKS (`samples` trials each, one at a time); `inject()` runs before each episode."""
    trajectories: list[Any] = []
    async with (
        ChatClient(server.base_url, "policy", retry=RETRY, role="policy") as pc,
        ChatClient(server.base_url, "user", retry=RETRY, role="user simulator") as uc,
    ):

        def done(traj: Any) -> None:
            trajectories.append(traj)
            if len(trajectories) < len(TASKS) * samples:
                inject()

        inject()
        try:
            records = await evaluate(
                EvalPlan(list(TASKS), samples, [1]),
                policy=OpenAIPolicy(pc),
                user=OpenAIUserSimulator(uc),
                limits=EpisodeLimits(max_turns=12),
                split=_split(),
                concurrency=1,
                results_path=results,
                on_done=done,
            )
        finally:
            faults = {"policy": dict(pc.faults), "user": dict(uc.faults)}
            sent = {"policy": pc.requests_sent, "user": uc.requests_sent}
    return records, trajectories, faults, sent


def _silent(rec: dict) -> bool:
    return not rec["success"] or rec["aborted"] or rec["termination"] not in ("agent_stop", "user_stop")


def test_fault_free_baseline(server, tmp_path):
    """Without faults every episode of TASKS succeeds: any failure below is the fault's doing."""
    records, _, faults, _ = asyncio.run(_evaluate(server, lambda: None, tmp_path / "r.jsonl"))
    assert [r["success"] for r in records] == [True] * len(TASKS)
    assert faults == {"policy": {}, "user": {}}


@pytest.mark.parametrize("role", list(ROLES))
@pytest.mark.parametrize("fault", list(FAULTS))
def test_transient_fault_is_retried_and_the_episode_keeps_its_fate(server, tmp_path, reliability, fault, role):
    kind = _policy_faults(role)[fault]
    per_episode = 0
    delivered_before = server.injected[fault]

    def inject() -> None:
        nonlocal per_episode
        per_episode += 1
        # mid-episode: the endpoint's second request of the episode
        server.inject(fault, 1, model=role, after=1, seconds=HANG_S if fault == "hang" else REFUSE_S)

    crashed: list[str] = []
    records: list[dict] = []
    trajectories: list[Any] = []
    faults: dict = {}
    try:
        records, trajectories, faults, _ = asyncio.run(_evaluate(server, inject, tmp_path / "r.jsonl"))
    except Exception as exc:  # noqa: BLE001 - counted as lost below, then reported by the assertion
        crashed.append(f"{type(exc).__name__}: {exc}")
    delivered = server.injected[fault] - delivered_before
    if kind is not None:  # an endpoint fault: retried, the episode ends as without it
        explicit = [not _silent(r) for r in records]
    elif fault == "invalid_tool_args":  # the policy's bad call: an error observation, recorded; the episode goes on
        explicit = [
            not _silent(r)
            and r["num_tool_errors"] == 1
            and any(c.parse_error and c.is_error for turn in t.turns for c in turn.tool_calls)
            for r, t in zip(records, trajectories, strict=True)
        ]
    else:  # the policy said nothing: τ²'s premature end, named in the record (scored 0, and says why)
        explicit = [
            r["termination"] == "policy_format_error" and r["aborted"] and t.turns[-1].content == ""
            for r, t in zip(records, trajectories, strict=True)
        ]
    survived = sum(explicit)
    lost = (len(TASKS) - len(records) if crashed else 0) + explicit.count(False)
    reliability(
        "endpoints",
        f"{ROLES[role]}: {fault} (transient)",
        injected=delivered,
        survived=survived,
        lost=lost,
        lost_what="silent failures",
    )
    assert not crashed, crashed
    assert delivered == N_TRANSIENT == len(TASKS) and server.pending_faults() == 0
    assert survived == len(TASKS) and lost == 0, records
    if kind is not None:
        assert [r["success"] for r in records] == [True] * len(TASKS), records
        assert faults[role].get(kind, 0) >= len(TASKS), faults  # each injection seen and retried as its kind


def _persistent_fault_kinds() -> list[tuple[str, str]]:
    return [(f, role) for role in ROLES for f, k in _policy_faults(role).items() if k is not None]


def _unscored_as_expected(rec: dict, fault: str, role: str) -> bool:
    """The record of the episode a persistent fault ended: explicit, ungraded, naming the endpoint and the fault."""
    kind = _policy_faults(role)[fault]
    return (
        rec["termination"] == "endpoint_error"
        and rec["scored"] is False
        and rec["reward"] is None
        and not rec["success"]
        and rec["endpoint_fault"] == kind
        and f"{ROLES[role]} endpoint" in rec["endpoint_error"]
        and f"failed after {RETRY.attempts} attempts" in rec["endpoint_error"]
    )


@pytest.mark.parametrize(("fault", "role"), _persistent_fault_kinds())
def test_persistent_fault_ends_the_episode_unscored_never_a_zero(server, tmp_path, reliability, fault, role):
    """The second of three episodes meets a dead endpoint: its record is explicit and unscored, and the evaluation
    (no unscored episode allowed at three trials) stops with `PolicyEndpointError`; the first keeps its record."""
    injected = explicit = lost = 0
    kept: list[list[str]] = []
    for i in range(N_PERSISTENT):
        inject = _second_episode_fails(server, fault, role)
        results = tmp_path / f"r{i}.jsonl"
        injected += 1
        stopped = False
        try:
            asyncio.run(_evaluate(server, inject, results))
        except PolicyEndpointError as exc:
            stopped = f"1 of {len(TASKS)} episodes ended on an endpoint" in str(exc)
        except Exception:  # noqa: BLE001 - a crash: counted as lost
            lost += 1
        written = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
        kept.append([r["task_id"] for r in written])
        failed = [r for r in written if r["scored"] is False]
        explicit += int(stopped and len(failed) == 1 and _unscored_as_expected(failed[0], fault, role))
        lost += sum(1 for r in written if r["scored"] and _silent(r))
        if fault == "refuse":
            _wait_listening(server)
        server.clear_faults()  # what the stopped evaluation did not consume
    reliability(
        "endpoints",
        f"{ROLES[role]}: {fault} past the retry budget",
        injected=injected,
        survived=explicit,
        lost=lost,
        lost_what="silent failures",
    )
    assert explicit == injected and lost == 0, kept
    assert kept == [TASKS[:2]] * N_PERSISTENT  # the finished episode, then the unscored one; nothing after


def test_an_unscored_episode_within_the_budget_leaves_its_task_out_of_the_rates(server, tmp_path, reliability):
    """Twelve trials allow one unscored episode: the evaluation completes, the summary rates the other tasks on all
    their trials and lists the incomplete one; nothing is counted as a failure."""
    records, _, _, _ = asyncio.run(
        _evaluate(server, _second_episode_fails(server, "status", "policy"), tmp_path / "r.jsonl", samples=4)
    )
    server.clear_faults()
    unscored = [r for r in records if r["scored"] is False]
    summary = compute_summary([TrialRecord.from_dict(r) for r in records], [1, 4])
    ok = (
        len(records) == 12
        and len(unscored) == 1
        and _unscored_as_expected(unscored[0], "status", "policy")
        and summary["unscored_trials"] == 1
        and summary["incomplete_tasks"] == [TASKS[0]]
        and summary["tasks"] == len(TASKS) - 1
        and summary["c_over_n"] == "8/8"
        and summary["pass_hat_k"] == {"1": 1.0, "4": 1.0}
        and "endpoint_error" not in summary["terminations"]
    )
    reliability(
        "endpoints",
        "policy: status past the retry budget, within the evaluation's allowance",
        injected=1,
        survived=int(ok),
        lost=sum(1 for r in records if r["scored"] and _silent(r)),
        lost_what="silent failures",
    )
    assert ok, (unscored, summary)


def _second_episode_fails(server: StubServer, fault: str, role: str):
    """An `inject` for `_evaluate`: the second episode's second request of `role` fails on every try."""
    calls = [0]

    def inject() -> None:
        calls[0] += 1
        if calls[0] != 2:
            return
        if fault == "refuse":
            server.inject("refuse", 1, model=role, after=1, seconds=REFUSE_PERSISTENT_S)
        else:
            server.inject(fault, RETRY.attempts, model=role, after=1, seconds=HANG_S)

    return inject


def _wait_listening(server: StubServer, timeout_s: float = 5.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", server.port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the stub did not listen again after a refuse fault")
