"""The airline environment and grader against the pinned τ² data (method.md c.2, c.2b, c.3)."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from longhaul.envs.airline.cowdb import diff_records, full_db_json
from longhaul.envs.airline.env import (
    AirlineEnv,
    EpisodeOverError,
    MessageAction,
    ToolAction,
    null_agent_grade,
    null_agent_outcomes,
    replay_gold,
)
from longhaul.envs.airline.tasks import base_db, get_task, load_tasks
from longhaul.envs.airline.toolnames import WRITE_TOOLS
from longhaul.envs.trajectory import Termination

ALL_IDS = [str(i) for i in range(50)]
WRITING = [t.id for t in load_tasks().values() if t.writes]


def test_task_ids_are_the_strings_0_to_49():
    assert list(load_tasks()) == ALL_IDS


def test_gold_replay_scores_1_on_all_50_tasks():
    grades = {t: replay_gold(t) for t in ALL_IDS}
    assert [t for t, g in grades.items() if not g.success] == []
    assert all(g.db_match and g.communicated and g.reward == 1.0 for g in grades.values())


def test_empty_trajectory_scores_0_on_every_writing_task_and_floor_matches_official_grader():
    assert len(WRITING) == 26
    floor = null_agent_outcomes()
    assert all(floor[t] == 0.0 for t in WRITING)
    # Official τ² grader (method.md c.2b): 27 zeros = the 26 writing tasks + task 3 (required string never said).
    assert sorted((t for t, v in floor.items() if v == 0.0), key=int) == sorted(WRITING + ["3"], key=int)
    assert sum(floor.values()) == 23


def test_gold_calls_without_saying_anything_fail_exactly_the_communicate_tasks():
    failing = [t for t in ALL_IDS if not replay_gold(t, communicate=False).success]
    assert failing == ["3", "7", "11", "14", "18", "23"]
    assert all(replay_gold(t, communicate=False).db_match for t in failing)


def _mutate(args: dict) -> dict:
    """Change exactly one argument of a write call (prefer changes the tool accepts, so the DB differs)."""
    a = copy.deepcopy(args)
    for key in ("nonfree_baggages", "total_baggages", "amount"):
        if isinstance(a.get(key), int):
            a[key] += 1
            return a
    if a.get("insurance") in ("yes", "no"):
        a["insurance"] = "no" if a["insurance"] == "yes" else "yes"
        return a
    if a.get("passengers"):
        a["passengers"][0]["first_name"] += "x"
        return a
    if a.get("cabin") in ("economy", "business", "basic_economy"):
        a["cabin"] = "business" if a["cabin"] != "business" else "economy"
        return a
    key = next(k for k, v in a.items() if isinstance(v, str))
    a[key] = a[key] + "X"
    return a


@pytest.mark.parametrize("task_id", WRITING)
def test_changing_one_argument_of_the_first_write_action_scores_0(task_id):
    task = get_task(task_id)
    first_write = next(i for i, a in enumerate(task.actions) if a.name in WRITE_TOOLS)
    env = AirlineEnv()
    env.reset(task)
    for i, a in enumerate(task.actions):
        args = _mutate(a.arguments) if i == first_write else dict(a.arguments)
        env.step(ToolAction(a.name, args))
    if task.communicate_info:
        env.step(MessageAction(" ".join(task.communicate_info)))
    env.terminate(Termination.USER_STOP)
    g = env.grade()
    assert not g.success and not g.db_match and g.reward == 0.0


def test_record_diff_agrees_with_full_database_comparison():
    from longhaul.envs.airline.grader import build_gold_db

    tid = WRITING[0]
    task = get_task(tid)
    env = AirlineEnv()
    env.reset(tid)
    for a in task.actions:
        env.step(ToolAction(a.name, dict(a.arguments)))
    gold = build_gold_db(task, base_db())
    assert diff_records(env.db, gold) == []
    assert full_db_json(env.db) == full_db_json(gold)
    other = AirlineEnv()
    other.reset(tid)  # nothing done
    assert diff_records(other.db, gold) != []
    assert full_db_json(other.db) != full_db_json(gold)
    assert full_db_json(other.db) == full_db_json(base_db())


def _digest(view) -> str:
    return hashlib.sha256(full_db_json(view).encode()).hexdigest()


def test_shared_base_is_never_mutated_and_episodes_are_isolated():
    base = base_db()
    before = _digest(base)
    for t in WRITING[:8]:
        replay_gold(t)
    a, b = AirlineEnv(), AirlineEnv()
    a.reset("1")
    b.reset("1")
    res = a.step(ToolAction("cancel_reservation", {"reservation_id": "EHGLP3"}))
    assert not res.is_error
    a.step(ToolAction("search_direct_flight", {"origin": "JFK", "destination": "LAX", "date": "2024-05-20"}))
    assert (
        json.loads(a.step(ToolAction("get_reservation_details", {"reservation_id": "EHGLP3"})).observation)["status"]
        == "cancelled"
    )
    assert (
        json.loads(b.step(ToolAction("get_reservation_details", {"reservation_id": "EHGLP3"})).observation)["status"]
        is None
    )
    assert _digest(base) == before


def test_reset_gives_a_fresh_view():
    env = AirlineEnv()
    env.reset("1")
    env.step(ToolAction("cancel_reservation", {"reservation_id": "EHGLP3"}))
    env.terminate(Termination.USER_STOP)
    env.reset("1")
    obs = env.step(ToolAction("get_reservation_details", {"reservation_id": "EHGLP3"})).observation
    assert json.loads(obs)["status"] is None
    assert not env.done and env.grade_computations == 0


@pytest.mark.parametrize(
    ("action", "known"),
    [
        (ToolAction("update_user_payment_methods", {"user_id": "x"}), False),  # hallucinated tool
        (ToolAction("get_user_details", None, '{"user_id": ', parse_error="invalid JSON"), True),
        (ToolAction("get_user_details", {}), True),  # missing argument
        (ToolAction("get_user_details", {"user_id": "nobody_0"}), True),  # the tool raises
        (
            ToolAction(
                "update_reservation_baggages",
                {"reservation_id": "EHGLP3", "total_baggages": "many", "nonfree_baggages": 0, "payment_id": "x"},
            ),
            True,
        ),
    ],
)
def test_tool_failures_are_error_observations_and_the_episode_continues(action, known):
    env = AirlineEnv()
    env.reset("0")
    res = env.step(action)
    assert res.is_error and res.observation.startswith("Error:") and not res.done
    assert res.known_tool is known
    ok = env.step(ToolAction("get_user_details", {"user_id": "emma_kim_9957"}))
    assert not ok.is_error and json.loads(ok.observation)["user_id"] == "emma_kim_9957"


def test_calculate_returns_the_rounded_float_as_text():
    env = AirlineEnv()
    env.reset("0")
    res = env.step(ToolAction("calculate", {"expression": "2 + 3"}))
    assert res.observation == "5.0"


def _baggage_update(**changes) -> ToolAction:
    args = {"reservation_id": "YAX4DR", "total_baggages": 2, "nonfree_baggages": 0, "payment_id": "credit_card_4938634"}
    args.update(changes)
    return ToolAction("update_reservation_baggages", args)


def _play_task_12(action: ToolAction):
    """Task 12's gold with its baggage update replaced by `action`."""
    env = AirlineEnv()
    env.reset("12")
    results = []
    for a in get_task("12").actions:
        results.append(
            env.step(action if a.name == "update_reservation_baggages" else ToolAction(a.name, dict(a.arguments)))
        )
    env.terminate(Termination.USER_STOP)
    return env, results, env.grade()


@pytest.mark.parametrize("value", ["2", 2.0])
def test_arguments_reach_the_tool_as_sent_like_tau2(value):
    """τ² calls the tool with the raw JSON values: a total of "2" or 2.0 is stored as sent, so the database
    differs from the gold one (the official evaluator scores 0; tests/unit/envs/test_tau2_parity.py)."""
    env, results, grade = _play_task_12(_baggage_update(total_baggages=value))
    assert not any(r.is_error for r in results)
    stored = json.loads(env.db.record_json("reservations", "YAX4DR"))["total_baggages"]
    assert stored == value and type(stored) is type(value)
    assert not grade.db_match and grade.reward == 0.0
    assert _play_task_12(_baggage_update())[2].success


def test_a_string_where_the_tool_computes_is_an_error_and_writes_nothing():
    env, results, grade = _play_task_12(_baggage_update(nonfree_baggages="0"))
    bad = next(r for r in results if r.is_error)
    assert bad.observation.startswith("Error: ") and "str" in bad.observation
    assert json.loads(env.db.record_json("reservations", "YAX4DR"))["total_baggages"] == 0  # unchanged
    assert not grade.db_match


def test_unknown_or_missing_arguments_are_refused_like_tau2():
    env = AirlineEnv()
    env.reset("1")
    before = env.db.record_json("reservations", "EHGLP3")
    res = env.step(ToolAction("cancel_reservation", {"reservation_id": "EHGLP3", "note": "customer asked"}))
    assert res.is_error and "unexpected keyword argument 'note'" in res.observation
    assert env.db.record_json("reservations", "EHGLP3") == before
    res = env.step(ToolAction("cancel_reservation", {}))
    assert res.is_error and "missing 1 required positional argument" in res.observation


def test_arguments_are_not_shared_with_the_database():
    """A value the tool stores as sent (here a list where a count belongs) is the episode's own copy."""
    env = AirlineEnv()
    env.reset("12")
    total = [2]
    assert not env.step(_baggage_update(total_baggages=total)).is_error
    total.append(3)
    assert json.loads(env.db.record_json("reservations", "YAX4DR"))["total_baggages"] == [2]


def test_transfer_is_an_ordinary_tool_by_default_like_tau2():
    """τ²: the transfer does not end the episode; a write after it counts, and the grade comes once, at the
    user's stop (###TRANSFER###)."""
    env = AirlineEnv()
    env.reset("0")  # gold: nothing changes
    res = env.step(ToolAction("transfer_to_human_agents", {"summary": "user wants a refund"}))
    assert not res.done and not res.is_error and res.observation == "Transfer successful" and not env.done
    assert not env.step(ToolAction("cancel_reservation", {"reservation_id": "EHGLP3"})).is_error
    env.terminate(Termination.USER_STOP)
    g = env.grade()
    assert not g.db_match and not g.success and env.grade_computations == 1


def test_transfer_then_stop_does_not_leak_the_gold_database():
    """Regression for the seed's leak (method.md c.3), under τ-bench 1's rule (transfer ends the episode): a wrong
    write, then a transfer (terminal), then the user's STOP (a second terminal event) must stay graded 0, graded
    once, without touching the live database."""
    env = AirlineEnv()
    env.reset("0", transfer_ends_episode=True)  # gold: nothing changes (the agent must refuse to cancel)
    env.step(ToolAction("cancel_reservation", {"reservation_id": "EHGLP3"}))
    res = env.step(ToolAction("transfer_to_human_agents", {"summary": "user wants a refund"}))
    assert res.done and env.termination == Termination.TRANSFER
    first = env.grade()
    live_before = env.db.record_json("reservations", "EHGLP3")
    assert env.terminate(Termination.USER_STOP) == Termination.TRANSFER  # second terminal event ignored
    second = env.grade()
    assert first is second and not second.success and not second.db_match
    assert env.grade_computations == 1
    assert env.db.record_json("reservations", "EHGLP3") == live_before  # grading wrote nothing
    assert '"cancelled"' in live_before
    with pytest.raises(EpisodeOverError):
        env.step(MessageAction("###STOP###"))


def test_a_failed_transfer_does_not_end_the_episode_under_the_tau1_rule():
    env = AirlineEnv()
    env.reset("0", transfer_ends_episode=True)
    res = env.step(ToolAction("transfer_to_human_agents", {"summary": "x", "urgent": True}))
    assert res.is_error and not res.done
    env.reset("0")
    assert env.transfer_ends_episode is False  # reset restores the τ² default


def test_first_terminal_event_wins():
    env = AirlineEnv()
    env.reset("0")
    res = env.step(MessageAction("Goodbye ###STOP###"))
    assert res.done and env.termination == Termination.AGENT_STOP
    env.terminate(Termination.MAX_TURNS)
    assert env.termination == Termination.AGENT_STOP
    assert env.grade().success  # task 0's correct outcome is an unchanged database


def test_premature_termination_scores_0_even_with_a_matching_database():
    env = AirlineEnv()
    env.reset("0")
    env.terminate(Termination.MAX_TURNS)
    g = env.grade()
    assert g.db_match and g.communicated and not g.success and g.details["premature"]
    assert null_agent_grade("0").success


def test_grade_before_the_end_is_refused():
    env = AirlineEnv()
    env.reset("0")
    with pytest.raises(RuntimeError, match="before the episode ended"):
        env.grade()


def test_communicate_check_is_case_insensitive_and_ignores_commas_in_the_text():
    env = AirlineEnv()
    env.reset("18")  # requires '23553'
    for a in get_task("18").actions:
        env.step(ToolAction(a.name, dict(a.arguments)))
    env.step(MessageAction("The total is $23,553."))
    env.terminate(Termination.USER_STOP)
    assert env.grade().success


def test_text_next_to_a_tool_call_counts_as_communicated():
    env = AirlineEnv()
    env.reset("3")
    for a in get_task("3").actions:
        env.step(ToolAction(a.name, dict(a.arguments)))
    env.note_assistant_text("You have 4 reservations; let me check one.")
    env.step(ToolAction("get_user_details", {"user_id": "nobody_0"}))
    env.terminate(Termination.USER_STOP)
    assert env.grade().communicated


def test_every_record_copy_dumps_exactly_like_the_original():
    from longhaul.envs.airline.cowdb import copy_record, record_json

    db = base_db()
    for table in ("flights", "users", "reservations"):
        for key, rec in getattr(db, table).items():
            assert record_json(copy_record(rec)) == record_json(rec), f"{table}/{key}"


def test_flight_dates_are_copied_on_fetch_only():
    from longhaul.envs.airline.cowdb import EpisodeDB

    base = base_db()
    view = EpisodeDB(base)
    number = next(iter(base.flights))
    date = next(iter(base.flights[number].dates))
    flight = view.flights[number]
    status = flight.dates[date]
    assert status is not base.flights[number].dates[date] and status == base.flights[number].dates[date]
    if hasattr(status, "available_seats"):
        status.available_seats["economy"] -= 1
        assert base.flights[number].dates[date].available_seats["economy"] == status.available_seats["economy"] + 1
        assert view.record_json("flights", number) != EpisodeDB(base).record_json("flights", number)
