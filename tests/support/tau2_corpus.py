"""A corpus of scripted τ² airline trajectories for grader parity (issue 14): longhaul vs the official evaluator.

Every case is a fixed script, built deterministically from the raw task list (`tasks.json`): the user's opening
message, then assistant turns, each either tool calls (optionally with text) or a message to the user with the
user's reply, and how the conversation ends (`user_stop`, `agent_stop`, or `max_turns`, a premature end).

The cases cover what an agent can get wrong or right: gold, gold without the required strings, empty, gold with
wrong-typed, extra, missing or nested-extra arguments, reordered, partial, duplicated and foreign writes,
hallucinated tools, transfers in the middle and at the end (under τ² semantics and, with
`transfer_ends_episode`, τ-bench 1's), the required strings said with case changes, commas, split, in a
tool-call turn, only by the user, or in the agent's stop message, and tool errors of every kind up to and past
τ²'s limit (`MAX_ERRORS`; the episode then ends as `too_many_errors` before the script does).

Pure stdlib on purpose: the same module builds the corpus in the project's tests (longhaul's runner plays each
case) and in a scratch virtualenv holding the official `tau2` package (`tests/support/tau2_expectations.py`
plays each case through τ²'s environment and `evaluate_simulation` and writes the expected rewards).
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

OPENING = "Hi, I need some help with my reservations."
CONTINUE = "Okay, please go on."
STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
WRITE_TOOLS = frozenset(
    {
        "book_reservation",
        "cancel_reservation",
        "send_certificate",
        "update_reservation_baggages",
        "update_reservation_flights",
        "update_reservation_passengers",
    }
)
TRANSFER_TOOL = "transfer_to_human_agents"
ENDS = ("user_stop", "agent_stop", "max_turns")
#: τ²'s limit on tool errors per episode (`tau2.config.DEFAULT_MAX_ERRORS`; longhaul's `TAU2_MAX_ERRORS`).
MAX_ERRORS = 10


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Turn:
    """One assistant turn: tool calls (with optional `content` text), or, without calls, a message to the user
    (`content`) answered by the user with `reply` (None only when the agent's message ends the episode)."""

    content: str = ""
    calls: tuple[Call, ...] = ()
    reply: str | None = None

    @property
    def to_user(self) -> bool:
        return not self.calls

    def to_json(self) -> dict[str, Any]:
        if self.calls:
            return {"content": self.content, "calls": [c.to_json() for c in self.calls]}
        return {"content": self.content, "reply": self.reply}


@dataclass(frozen=True)
class Case:
    id: str
    task_id: str
    category: str
    turns: tuple[Turn, ...]
    end: str = "user_stop"
    transfer_ends_episode: bool = False
    opening: str = OPENING

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task_id": self.task_id,
            "category": self.category,
            "opening": self.opening,
            "turns": [t.to_json() for t in self.turns],
            "end": self.end,
            "transfer_ends_episode": self.transfer_ends_episode,
        }

    def fingerprint(self) -> str:
        """Short hash of the script (ints, floats, strings and booleans stay distinct in JSON): an expectation
        recorded for another script is detected as stale instead of compared."""
        canon = json.dumps(self.to_json(), sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    @property
    def max_turns(self) -> int:
        """The turn limit that makes the script end as `end` says (the runner stops at it for `max_turns`)."""
        return len(self.turns) if self.end == "max_turns" else len(self.turns) + 1


# ---------------------------------------------------------------------------------------------------------
# Building blocks


def _gold(task: dict[str, Any]) -> list[Call]:
    crit = task.get("evaluation_criteria") or {}
    return [Call(a["name"], copy.deepcopy(a.get("arguments") or {})) for a in crit.get("actions") or []]


def _info(task: dict[str, Any]) -> list[str]:
    return [str(s) for s in (task.get("evaluation_criteria") or {}).get("communicate_info") or []]


def _each(calls: list[Call], content: str = "") -> list[Turn]:
    """One turn per call (the first carries `content`, if any)."""
    return [Turn(content if i == 0 else "", (c,)) for i, c in enumerate(calls)]


def _info_text(task: dict[str, Any]) -> str:
    info = _info(task)
    return ("Here is what you asked for: " + "; ".join(info) + ".") if info else "Your request has been handled."


def _closing(text: str, marker: str = STOP) -> Turn:
    return Turn(text, reply=f"Thanks, that is all. {marker}")


def _script(task: dict[str, Any], calls: list[Call], *, say: str | None = None, marker: str = STOP) -> tuple[Turn, ...]:
    """Calls one per turn, then a message saying the required strings (or `say`), then the user's stop."""
    return (*_each(calls), _closing(_info_text(task) if say is None else say, marker))


def _with(call: Call, **changes: Any) -> Call:
    args = copy.deepcopy(call.arguments)
    args.update(changes)
    return Call(call.name, args)


def _without(call: Call, key: str) -> Call:
    return Call(call.name, {k: copy.deepcopy(v) for k, v in call.arguments.items() if k != key})


def _is_write(call: Call) -> bool:
    return call.name in WRITE_TOOLS


def _write_indices(calls: list[Call]) -> list[int]:
    return [i for i, c in enumerate(calls) if _is_write(c)]


def _transfer(summary: str = "The customer needs a human agent.", **extra: Any) -> Call:
    return Call(TRANSFER_TOOL, {"summary": summary, **extra})


# ---------------------------------------------------------------------------------------------------------
# The corpus


def build_corpus(tasks: list[dict[str, Any]]) -> list[Case]:
    """All cases, in a fixed order, with unique ids. `tasks` is the parsed `tasks.json` (a list of dicts)."""
    tasks = sorted(tasks, key=lambda t: int(t["id"]))
    by_id = {str(t["id"]): t for t in tasks}
    writing = [str(t["id"]) for t in tasks if any(_is_write(c) for c in _gold(t))]
    informing = [str(t["id"]) for t in tasks if _info(t)]
    cases: list[Case] = []

    def add(cid: str, tid: str, category: str, turns: tuple[Turn, ...] | list[Turn], **kw: Any) -> None:
        cases.append(Case(cid, tid, category, tuple(turns), **kw))

    def foreign_write(tid: str) -> Call:
        """The first write of the next writing task after `tid` (cyclic)."""
        later = [o for o in writing if int(o) > int(tid)] + [o for o in writing if int(o) < int(tid)]
        gold = _gold(by_id[later[0]])
        return gold[_write_indices(gold)[0]]

    user_ids = sorted({c.arguments["user_id"] for t in tasks for c in _gold(t) if "user_id" in c.arguments})

    for t in tasks:
        tid = str(t["id"])
        gold = _gold(t)
        writes = _write_indices(gold)
        info = _info(t)

        # Reference behaviour.
        add(f"gold/{tid}", tid, "gold", _script(t, gold))
        add(f"gold_silent/{tid}", tid, "gold_silent", _script(t, gold, say="All done."))
        add(f"empty/{tid}", tid, "empty", [_closing("Hello, how can I help you today?")])

        # Someone else's write after the gold (cancels or changes another customer's booking).
        add(f"foreign_write/{tid}", tid, "foreign", _script(t, [*gold, foreign_write(tid)]))

        if int(tid) % 5 == 0:
            add(
                f"gold_agent_stop/{tid}",
                tid,
                "gold_agent_stop",
                [*_each(gold), Turn(_info_text(t) + " Goodbye! " + STOP)],
                end="agent_stop",
            )
            add(
                f"premature/{tid}",
                tid,
                "premature",
                [*_each(gold), Turn(_info_text(t), reply="One more question, please.")],
                end="max_turns",
            )
            # Reads of other customers and a failing read are harmless.
            uid = user_ids[int(tid) % len(user_ids)]
            add(
                f"foreign_reads/{tid}",
                tid,
                "foreign",
                _script(
                    t,
                    [
                        Call("get_user_details", {"user_id": uid}),
                        Call("get_reservation_details", {"reservation_id": "ZZZZZZ"}),
                        *gold,
                    ],
                ),
            )
            add(
                f"hallucinated_tool/{tid}",
                tid,
                "hallucinated",
                _script(t, [Call("update_user_profile", {"user_id": uid, "note": "x"}), *gold]),
            )
        if len(gold) >= 2 and int(tid) % 3 == 0:
            add(f"gold_one_turn/{tid}", tid, "gold_batched", [Turn("", tuple(gold)), _closing(_info_text(t))])

        # Argument types: the raw JSON values reach the tool (τ² does no conversion).
        for i in writes:
            call = gold[i]
            for key, value in call.arguments.items():
                if isinstance(value, bool) or not isinstance(value, int):
                    continue
                variants: dict[str, Any] = {"str": str(value), "float": float(value)}
                if value in (0, 1):
                    variants["bool"] = bool(value)
                if key == "nonfree_baggages" or key == "amount":
                    variants["half"] = value + 0.5
                for vname, v in variants.items():
                    changed = [*gold]
                    changed[i] = _with(call, **{key: v})
                    add(f"wrong_type/{tid}/a{i}/{key}:{vname}", tid, "wrong_type", _script(t, changed))
            if call.name == "book_reservation" and call.arguments.get("payment_methods"):
                pm = copy.deepcopy(call.arguments["payment_methods"])
                pm[0]["amount"] = str(pm[0]["amount"])
                changed = [*gold]
                changed[i] = _with(call, payment_methods=pm)
                add(f"wrong_type/{tid}/a{i}/payment_amount:str", tid, "wrong_type", _script(t, changed))
            for key in ("cabin", "insurance", "flight_type"):
                if isinstance(call.arguments.get(key), str):
                    changed = [*gold]
                    changed[i] = _with(call, **{key: _off_enum(key, call.arguments[key])})
                    add(f"wrong_enum/{tid}/a{i}/{key}", tid, "wrong_type", _script(t, changed))
            if isinstance(call.arguments.get("flights"), list) and call.arguments["flights"]:
                fl = copy.deepcopy(call.arguments["flights"])
                fl[0]["price"] = 1
                changed = [*gold]
                changed[i] = _with(call, flights=fl)
                add(f"nested_extra/{tid}/a{i}/flights", tid, "extra_arg", _script(t, changed))
            if isinstance(call.arguments.get("passengers"), list) and call.arguments["passengers"]:
                ps = copy.deepcopy(call.arguments["passengers"])
                ps[0]["middle_name"] = "Q"
                changed = [*gold]
                changed[i] = _with(call, passengers=ps)
                add(f"nested_extra/{tid}/a{i}/passengers", tid, "extra_arg", _script(t, changed))

        # Unknown and missing arguments.
        first_read = next((i for i, c in enumerate(gold) if not _is_write(c)), None)
        for i in [*writes[:1], *([first_read] if first_read is not None else [])]:
            changed = [*gold]
            changed[i] = _with(gold[i], note="as the customer asked")
            add(f"extra_arg/{tid}/a{i}", tid, "extra_arg", _script(t, changed))
        if writes:
            i = writes[0]
            changed = [*gold]
            changed[i] = _without(gold[i], list(gold[i].arguments)[-1])
            add(f"missing_arg/{tid}/a{i}", tid, "missing_arg", _script(t, changed))
            # Same call, corrected in the next turn: the failed attempt wrote nothing.
            fixed = [*gold[:i], _with(gold[i], note="x"), *gold[i:]]
            add(f"extra_arg_then_fixed/{tid}/a{i}", tid, "extra_arg", _script(t, fixed))

        # Order, omissions, repetitions.
        if len(gold) >= 2:
            add(f"reversed/{tid}", tid, "reordered", _script(t, gold[::-1]))
        if len(writes) >= 2:
            a, b = writes[0], writes[1]
            swapped = [*gold]
            swapped[a], swapped[b] = gold[b], gold[a]
            add(f"swap_writes/{tid}", tid, "reordered", _script(t, swapped))
            add(f"drop_first_write/{tid}", tid, "partial", _script(t, [c for j, c in enumerate(gold) if j != a]))
        if writes:
            add(
                f"drop_last_write/{tid}", tid, "partial", _script(t, [c for j, c in enumerate(gold) if j != writes[-1]])
            )
            add(f"reads_only/{tid}", tid, "partial", _script(t, [c for c in gold if not _is_write(c)]))
            k = writes[-1]
            add(f"duplicate_write/{tid}", tid, "duplicate", _script(t, [*gold[: k + 1], gold[k], *gold[k + 1 :]]))

        # Transfers: an ordinary tool in τ² (the user ends the conversation); terminal with the τ1 option.
        if writes:
            k = writes[-1]
            mid = [*gold[:k], _transfer(), *gold[k:]]
            add(f"transfer_mid/{tid}", tid, "transfer_mid", _script(t, mid, marker=TRANSFER))
            add(
                f"transfer_mid_tau1/{tid}",
                tid,
                "transfer_mid_tau1",
                _script(t, mid, marker=TRANSFER),
                transfer_ends_episode=True,
            )
        if int(tid) % 4 == 1:
            after = [*gold, _transfer(), foreign_write(tid)]
            add(f"transfer_then_write/{tid}", tid, "transfer_mid", _script(t, after, marker=TRANSFER))
            add(
                f"transfer_then_write_tau1/{tid}",
                tid,
                "transfer_mid_tau1",
                _script(t, after, marker=TRANSFER),
                transfer_ends_episode=True,
            )
        if int(tid) % 5 == 2 or tid in informing:
            end = [*_each(gold), Turn("", (_transfer(),)), _closing(_info_text(t), TRANSFER)]
            add(f"transfer_end/{tid}", tid, "transfer_end", end)
            add(f"transfer_end_tau1/{tid}", tid, "transfer_end_tau1", end, transfer_ends_episode=True)
        if writes and int(tid) % 6 == 0:
            bad = [*gold[: writes[0]], _transfer(note="urgent"), *gold[writes[0] :]]
            add(f"transfer_bad_args_tau1/{tid}", tid, "transfer_mid_tau1", _script(t, bad), transfer_ends_episode=True)
            batch = [*_each(gold[: writes[0]]), Turn("", (_transfer(), *gold[writes[0] :])), _closing(_info_text(t))]
            add(f"transfer_batch_tau1/{tid}", tid, "transfer_mid_tau1", batch, transfer_ends_episode=True)
            add(f"transfer_batch/{tid}", tid, "transfer_mid", batch)

        # Saying the required strings.
        if info:
            joined = " and ".join(info)
            variants_say: dict[str, list[Turn]] = {
                "upper": [*_each(gold), _closing(("TOTAL: " + joined).upper())],
                "lower": [*_each(gold), _closing(("Total: " + joined).lower())],
                "commas": [*_each(gold), _closing("Total: " + " and ".join(",".join(s) for s in info) + ".")],
                "thousands": [*_each(gold), _closing("Total: " + " and ".join(_thousands(s) for s in info))],
                "dollar_cents": [*_each(gold), _closing("Total: " + " and ".join(f"${s}.00" for s in info))],
                "spaced": [*_each(gold), _closing("Total: " + " and ".join(" ".join(s) for s in info))],
                "in_tool_turn": [*_each(gold, content=f"Noting for you: {joined}."), _closing("All done.")],
                "before_calls": [Turn(f"I expect {joined}.", reply=CONTINUE), *_each(gold), _closing("All done.")],
                "user_only": [
                    *_each(gold),
                    Turn("Anything else?", reply=f"So it is {joined}, right?"),
                    _closing("Yes."),
                ],
                "agent_stop": [*_each(gold), Turn(f"It comes to {joined}. {STOP}")],
            }
            if any(len(s) >= 2 for s in info):
                halves = [(s[: len(s) // 2], s[len(s) // 2 :]) for s in info]
                variants_say["split"] = [
                    *_each(gold),
                    Turn("Part one: " + " ".join(h[0] for h in halves), reply=CONTINUE),
                    _closing("Part two: " + " ".join(h[1] for h in halves)),
                ]
            if len(info) >= 2:
                variants_say["first_only"] = [*_each(gold), _closing(f"Total: {info[0]}.")]
            for name, turns in variants_say.items():
                end = "agent_stop" if name == "agent_stop" else "user_stop"
                add(f"communicate/{tid}/{name}", tid, "communicate", turns, end=end)
            add(
                f"communicate/{tid}/premature",
                tid,
                "premature",
                [*_each(gold), Turn(_info_text(t), reply=CONTINUE)],
                end="max_turns",
            )

        # τ²'s error limit (MAX_ERRORS tool errors in an episode end it as too_many_errors, scored 0): exactly at
        # the limit, one below, spread over the conversation, crossed inside one turn, errors of every kind.
        if int(tid) % 6 == 1 or int(tid) % 11 == 1:
            uid = user_ids[int(tid) % len(user_ids)]
            kinds = _error_calls(uid, gold)
            errs = [kinds[(int(tid) + j) % len(kinds)] for j in range(MAX_ERRORS + 1)]
            at, below = errs[:MAX_ERRORS], errs[: MAX_ERRORS - 1]
            add(f"errors/at_limit/{tid}", tid, "errors_at_limit", _script(t, [*at, *gold]))
            add(f"errors/below_limit/{tid}", tid, "errors_below_limit", _script(t, [*below, *gold]))
            add(f"errors/at_limit_after_gold/{tid}", tid, "errors_at_limit", _script(t, [*gold, *at]))
            add(f"errors/below_limit_after_gold/{tid}", tid, "errors_below_limit", _script(t, [*gold, *below]))
            # The count runs over the whole episode (messages to the user in between do not reset it).
            half = MAX_ERRORS // 2
            add(
                f"errors/spread_at_limit/{tid}",
                tid,
                "errors_at_limit",
                [
                    *_each(at[:half]),
                    Turn("Still checking, one moment.", reply=CONTINUE),
                    *_each(at[half:]),
                    *_each(gold),
                    _closing(_info_text(t)),
                ],
            )
            add(
                f"errors/spread_below_limit/{tid}",
                tid,
                "errors_below_limit",
                [
                    *_each(below[:half]),
                    Turn("Still checking, one moment.", reply=CONTINUE),
                    *_each(below[half:]),
                    *_each(gold),
                    _closing(_info_text(t)),
                ],
            )
            # Crossed inside one turn: the rest of that turn's calls still run, then the episode ends.
            add(
                f"errors/batch_crossing/{tid}",
                tid,
                "errors_at_limit",
                [
                    *_each(errs[: MAX_ERRORS - 2]),
                    Turn("", (errs[MAX_ERRORS - 2], errs[MAX_ERRORS - 1], *gold, errs[MAX_ERRORS])),
                    _closing(_info_text(t)),
                ],
            )
            add(
                f"errors/batch_below/{tid}",
                tid,
                "errors_below_limit",
                [*_each(errs[: MAX_ERRORS - 2]), Turn("", (errs[MAX_ERRORS - 2], *gold)), _closing(_info_text(t))],
            )
            # All in one turn, and the limit on the last turn the turn limit allows.
            add(
                f"errors/one_turn_at_limit/{tid}",
                tid,
                "errors_at_limit",
                [Turn("", tuple(at)), *_each(gold), _closing(_info_text(t))],
            )
            add(f"errors/at_limit_last_turn/{tid}", tid, "errors_at_limit", _each([*gold, *at]), end="max_turns")
            # Only one kind of error: the same failing call repeated.
            add(
                f"errors/same_call_at_limit/{tid}", tid, "errors_at_limit", _script(t, [*gold, *[errs[0]] * MAX_ERRORS])
            )

    ids = [c.id for c in cases]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"duplicate case ids: {sorted(dupes)}")
    return cases


def _error_calls(uid: str, gold: list[Call]) -> list[Call]:
    """Calls that fail, one per kind of error: an unknown tool, an unexpected or a missing argument, a record not
    found (read and write), an expression the calculator refuses, and the task's own first write with an extra
    argument (when it has one). Each returns an error observation and changes nothing, in τ² and in longhaul."""
    calls = [
        Call("update_user_profile", {"user_id": uid, "note": "x"}),
        Call("get_user_details", {"user_id": uid, "note": "x"}),
        Call("get_reservation_details", {}),
        Call("get_reservation_details", {"reservation_id": "ZZZZZZ"}),
        Call("get_user_details", {"user_id": "no_such_user_0000"}),
        Call("cancel_reservation", {"reservation_id": "ZZZZZZ"}),
        Call("get_flight_status", {"flight_number": "HAT999", "date": "2024-05-20"}),
        Call("calculate", {"expression": "1 / 0"}),
        Call("search_direct_flight", {"origin": "JFK", "destination": "LAX", "date": "2024-05-20", "cabin": "economy"}),
    ]
    writes = [c for c in gold if _is_write(c)]
    if writes:
        calls.append(_with(writes[0], note="as the customer asked"))
    return calls


def _off_enum(key: str, value: str) -> Any:
    """A near miss for an enumerated argument: a boolean for yes/no, a capitalised cabin, a spaced flight type."""
    if key == "insurance":
        return value == "yes"
    if key == "cabin":
        return value.capitalize()
    return value.replace("_", " ")


def _thousands(s: str) -> str:
    return f"{int(s):,}" if s.isdigit() else s


def load_expectations(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
