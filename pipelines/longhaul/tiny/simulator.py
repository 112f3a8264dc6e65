"""Scripted conversations for the tiny user simulator's warm start, in the served simulator's own prompt format.

Every conversation is `build_user_messages(instructions, dialogue)`: the task's user instructions as the scenario,
the agent's greeting, then a short dialogue with the roles flipped, so the simulator's lines are the `assistant`
side (the only labelled tokens). The simulator opens with its request (`first_user_message`), answers the agent's
questions about the facts in its instructions (user id, reservation id), and ends with `###STOP###` after the
agent's closing message or `###TRANSFER###` after the agent's transfer message.

Pure: the task and its instructions text are passed in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from longhaul.clients.user_simulator import build_user_messages
from longhaul.envs.prompt import STOP_MARKERS, is_user_stop
from longhaul.tiny.gold import closing_message, first_user_message

#: The simulator's end markers: `###STOP###` (goal reached) and `###TRANSFER###` (handed to a human agent).
USER_STOP, USER_TRANSFER = STOP_MARKERS[:2]

#: The message the airline policy tells the agent to send after `transfer_to_human_agents` (policy.md).
TRANSFER_MESSAGE = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."

USER_ID_QUESTIONS = (
    "Could you please provide your user id?",
    "May I have your user ID, please?",
    "To look up your profile, what is your user id?",
)
RESERVATION_QUESTIONS = (
    "What is the reservation id?",
    "Could you tell me the reservation number?",
    "Which reservation is it? Please give me the reservation id.",
)
#: The answer when the instructions hold no reservation id (the simulator must not invent one).
NO_RESERVATION_ANSWER = "I don't remember the reservation id."

_USER_ID = re.compile(r"\b[a-z]+(?:_[a-z]+)+_\d+\b")
# Reservation ids are six upper-case letters or digits; flight numbers (HAT + 3 digits) look alike.
_RESERVATION_ID = re.compile(r"\b(?!HAT\d{3}\b)[A-Z0-9]{6}\b")


def user_facts(instructions: str) -> tuple[str | None, list[str]]:
    """The user id (or None) and the reservation ids (in order of appearance, unique) named in `instructions`."""
    uid = _USER_ID.search(instructions)
    rids = list(dict.fromkeys(_RESERVATION_ID.findall(instructions)))
    return (uid.group(0) if uid else None), rids


def _answer_user_id(uid: str | None) -> str:
    return f"My user id is {uid}." if uid else "I don't remember my user id."


def _answer_reservation(rids: Sequence[str]) -> str:
    if not rids:
        return NO_RESERVATION_ANSWER
    if len(rids) == 1:
        return f"The reservation id is {rids[0]}."
    return f"The reservation ids are {', '.join(rids)}."


def _turns(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    """An agent-side dialogue from (agent line, user line) pairs."""
    out: list[dict[str, str]] = []
    for agent, user in pairs:
        out += [{"role": "assistant", "content": agent}, {"role": "user", "content": user}]
    return out


def simulator_dialogues(task: dict[str, Any], instructions: str, rng: Any) -> list[list[dict[str, str]]]:
    """Three dialogues from the AGENT's point of view (the runner's `conversation`): the request, then
    (1) the closing message and `###STOP###`; (2) the user id and reservation id asked and answered, then the
    closing message and `###STOP###`; (3) the user id asked and answered, then the transfer message and
    `###TRANSFER###`. `rng` picks the agent's phrasing of each question."""
    opening = [{"role": "user", "content": first_user_message(task)}]
    uid, rids = user_facts(instructions)
    closing = closing_message(task)
    ask_uid = (rng.choice(USER_ID_QUESTIONS), _answer_user_id(uid))
    ask_res = (rng.choice(RESERVATION_QUESTIONS), _answer_reservation(rids))
    return [
        opening + _turns((closing, USER_STOP)),
        opening + _turns(ask_uid, ask_res, (closing, USER_STOP)),
        opening + _turns(ask_uid, (TRANSFER_MESSAGE, USER_TRANSFER)),
    ]


def simulator_conversations(task: dict[str, Any], instructions: str, rng: Any) -> list[list[dict[str, str]]]:
    """The warm-start conversations of one task, exactly as the served simulator is prompted
    (`build_user_messages`); the simulator's own lines are the `assistant` messages."""
    return [build_user_messages(instructions, d) for d in simulator_dialogues(task, instructions, rng)]


def simulator_check_prompts(task: dict[str, Any], instructions: str) -> dict[str, list[dict[str, str]]]:
    """Prompts for a held-out check of the simulator (each awaits its next line): `opening` (the first turn),
    `after_closing` (should be `###STOP###`), `after_transfer` (`###TRANSFER###`) and `user_id` (an answer
    naming the user id)."""
    opening = [{"role": "user", "content": first_user_message(task)}]
    dialogues = {
        "opening": [],
        "after_closing": [*opening, {"role": "assistant", "content": closing_message(task)}],
        "after_transfer": [*opening, {"role": "assistant", "content": TRANSFER_MESSAGE}],
        "user_id": [*opening, {"role": "assistant", "content": USER_ID_QUESTIONS[0]}],
    }
    return {k: build_user_messages(instructions, d) for k, d in dialogues.items()}


def judge_simulator_replies(replies: dict[str, str], user_id: str | None) -> dict[str, bool]:
    """Whether each reply to `simulator_check_prompts` is what a user would say: the opening is a request (text,
    no end marker), `###STOP###` after the closing message, `###TRANSFER###` after the transfer message, and the
    user id when asked for it."""
    opening = replies["opening"]
    return {
        "request_first": bool(opening.strip()) and not is_user_stop(opening),
        "stop_after_closing": USER_STOP in replies["after_closing"],
        "transfer_after_transfer": USER_TRANSFER in replies["after_transfer"],
        "user_id_answered": bool(user_id) and user_id in replies["user_id"],
    }
