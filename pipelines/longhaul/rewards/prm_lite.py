"""PRM-Lite "v4-optimal": the rule-based process reward of the original method (shared notes, method.md a).

Input is the *action history* of a trajectory (`build_action_history`): one entry per executed tool call, plus
`implicit_think` pseudo-entries for long messages to the user. `score_prm_lite` evaluates every rule on every
entry and returns per-step rule hits, per-turn scores and the clipped trajectory process score.

Two modes:

* ``seed_compat=True`` reproduces the original's production reward exactly, quirks included: substring
  placeholder keywords (the name "Bethany" contains "any"), the parameter-name-*contains*-schema-key check that
  stops at the first key, a redundancy window of the last 3 history entries in which think entries are skipped
  but still use up the window, `implicit_think` earning the conditional think bonus and counting as the previous
  think of the consecutive-think exception, and the original tool classes (τ1 airline: no `get_flight_status`).
  The original never recorded the assistant text of a turn that made a tool call (nothing called
  `record_assistant_content`, method.md a.2), so the history built from a trajectory in this mode carries no
  text on its tool-call entries and the cheap-reasoning rule (P9) never fires — as in production there.
  `score_prm_lite` itself still applies P9 to entries that carry text, as the original scoring function did
  (its unit tests and the doc example pass text). The process score is summed in the original's order and
  floating-point rounding: step scores rule by rule, their mean left to right (Python 3.10's ``sum``, the
  original's interpreter; 3.12's ``sum`` compensates and could differ in the last digit), then
  ``((mean + P5) + B7) + P8``, then the clip. Entries may carry the caller's own `param_str` (the original
  unit tests stored a Python-repr string there, which is why their 6-step example scores −0.04333 instead of
  the production −0.05333).
* ``seed_compat=False`` (default) fixes the documented defects:
  1. placeholder keywords match whole words of short (≤ 4 words) values only, never substrings of real names or
     words of free text (a transfer summary saying "any flight" is not a placeholder);
  2. the identifier schema check applies to parameters *named* like the key (``reservation_id`` or
     ``*_reservation_id``), not to every name containing it;
  3. the redundancy window is the last N *tool calls* (think entries neither match nor use up the window);
  4. `implicit_think` entries earn no think bonus (the original docs say that reward was removed; the code
     still paid it) but still count as reasoning for the no-reasoning rule;
  5. an `implicit_think` entry is not "the previous think" of the consecutive-think exception: a `think` right
     after one earns its bonus. The exception exists so that a chain of thinks is paid once; an implicit
     think is paid nothing here, so there is nothing to pay twice, and it is a message to the user — the
     user's reply lies between it and the next think, which reasons about that reply. Counting it would make
     an informative message to the user cost the next think its bonus;
  6. the τ² tool `get_flight_status` is a READ tool;
  7. the cheap-reasoning rule (P9) sees the assistant text of the turn that made the call;
  8. calls to unknown (hallucinated) tools and unparsable calls never enter the history (as in the original)
     but are counted in `PrmLiteResult.num_unknown_tool_calls` / `num_unparsed_tool_calls` and can be
     penalised with the `unknown_tool` rule (weight 0 by default: counted, not scored).

In both modes the signature of a call for the redundancy and error-repetition rules is the original's:
(tool, lower-cased sorted-key JSON of the arguments) — type-exact (``1.0``, ``"1.0"``, ``1`` and ``true`` are
four different arguments; only letter case and key order are ignored) and a property of the entry alone, never
of the other entries of the history.

Pure: no I/O, no clock, no randomness.

Size: over 400 lines because every PRM-Lite rule with its parameters and its reference to method.md, in one place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any, NamedTuple

from longhaul.envs.airline.toolnames import WRITE_TOOLS
from longhaul.rewards.prm_lite_params import PARAM_DOMAINS, RULE_DEFAULTS

# ---------------------------------------------------------------------------------------------------------
# Tool classes, entity patterns and placeholder vocabulary (method.md a.1)

SEED_READ_TOOLS = frozenset(
    {
        "list_all_airports",
        "search_direct_flight",
        "search_onestop_flight",
        "get_user_details",
        "get_reservation_details",
        "calculate",
    }
)
READ_TOOLS = SEED_READ_TOOLS | {"get_flight_status"}
ESCALATION_TOOLS = frozenset({"transfer_to_human_agents"})
THINK_TOOLS = frozenset({"think", "implicit_think"})
IMPLICIT_THINK = "implicit_think"

ENTITY_PATTERNS: Mapping[str, re.Pattern[str]] = MappingProxyType(
    {
        "reservation_id": re.compile(r"\b[A-Z0-9]{6}\b"),
        "user_id": re.compile(r"\b[a-z]+_[a-z]+_[0-9]+\b"),
        "payment_id": re.compile(r"\b(?:credit_card|gift_card|certificate)_[0-9]+\b"),
        "flight_number": re.compile(r"\b[A-Z]{3}[0-9]{3}\b"),
        "date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    }
)

#: Identifier parameters and the values they must match (checked in this order, as in the original).
SCHEMA_PATTERNS: Mapping[str, re.Pattern[str]] = MappingProxyType(
    {
        "reservation_id": re.compile(r"^[A-Z0-9]{6}$"),
        "user_id": re.compile(r"^[a-z]+_[a-z]+_[0-9]+$"),
        "payment_id": re.compile(r"^(credit_card|gift_card|certificate)_[0-9]+$"),
        "flight_number": re.compile(r"^[A-Z]{3}[0-9]{3}$"),
        "origin": re.compile(r"^[A-Z]{3}$"),
        "destination": re.compile(r"^[A-Z]{3}$"),
        "date": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    }
)

PLACEHOLDER_KEYWORDS = frozenset(
    {
        "previous",
        "unknown",
        "placeholder",
        "none",
        "null",
        "n/a",
        "any",
        "some",
        "first",
        "last",
        "default",
        "example",
        "sample",
        "test",
        "dummy",
        "temp",
        "temporary",
    }
)
_WORD = re.compile(r"[a-z0-9]+(?:/[a-z0-9]+)?")
_MAX_PLACEHOLDER_WORDS = 4

#: Rules evaluated per history entry, in report order.
STEP_RULES = (
    "placeholder",
    "redundancy",
    "error_repetition",
    "recovery",
    "escalation",
    "data_chain",
    "first_read",
    "think_bonus",
    "cheap_reasoning",
)
#: Rules evaluated once per trajectory.
TRAJECTORY_RULES = ("no_reasoning", "read_diversity", "length_penalty", "unknown_tool")


# ---------------------------------------------------------------------------------------------------------
# Parameters


class RuleParams:
    """The merged PRM-Lite parameter table: defaults from `RULE_DEFAULTS` plus the spec's overrides."""

    __slots__ = ("_values", "_enabled")

    def __init__(self, values: dict[str, dict[str, float]], enabled: dict[str, bool]) -> None:
        self._values = values
        self._enabled = enabled

    def get(self, rule: str, param: str) -> float:
        return self._values[rule][param]

    def enabled(self, rule: str) -> bool:
        return self._enabled[rule]

    def as_dict(self) -> dict[str, dict[str, float | bool]]:
        return {r: {**v, "enabled": self._enabled[r]} for r, v in self._values.items()}


def build_rule_params(overrides: Mapping[str, Mapping[str, float | bool]] | None = None) -> RuleParams:
    """Merge per-rule overrides (`spec.reward.rules`) into the defaults. Unknown names raise ValueError with
    the valid choices (the spec validates them first; this guards direct callers)."""
    values = {r: dict(p) for r, p in RULE_DEFAULTS.items()}
    enabled = dict.fromkeys(RULE_DEFAULTS, True)
    for rule, params in (overrides or {}).items():
        if rule not in values:
            raise ValueError(f"unknown PRM-Lite rule '{rule}'; valid: {', '.join(RULE_DEFAULTS)}")
        for name, value in params.items():
            if name == "enabled":
                enabled[rule] = bool(value)
            elif name in values[rule]:
                values[rule][name] = _in_domain(rule, name, value)
            else:
                raise ValueError(
                    f"PRM-Lite rule '{rule}': unknown parameter '{name}'; valid: {', '.join([*values[rule], 'enabled'])}"  # noqa: E501 - a string literal kept whole
                )
    return RuleParams(values, enabled)


def _in_domain(rule: str, name: str, value: Any) -> float:
    """`value` as a float when it lies in the parameter's domain (`PARAM_DOMAINS`: type, bounds; never NaN)."""
    dom = PARAM_DOMAINS[rule][name]
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (dom.type is float or float(value).is_integer())
    ok = ok and (dom.low < value if dom.low_open else dom.low <= value) and value <= dom.high
    if not ok:
        raise ValueError(
            f"PRM-Lite rule '{rule}': {name} must be a {'whole ' if dom.type is int else ''}number "
            f"{'above' if dom.low_open else 'from'} {dom.low:g} to {dom.high:g} (got {value!r})"
        )
    return float(value)


DEFAULT_PARAMS = build_rule_params()


# ---------------------------------------------------------------------------------------------------------
# Action history


def canonical_param_str(params: Mapping[str, Any]) -> str:
    """The original's signature of a call's arguments: sorted-key JSON, lower-cased."""
    return json.dumps(params, sort_keys=True, ensure_ascii=False).lower()


#: One pass over the observation. Every entity is a whole word run (dates: three runs joined by '-'), so this
#: finds exactly what the five separate findall passes find; a string that fits two kinds (a flight number is
#: also a valid reservation id, a payment id also a valid user id) is listed under both, as there.
_ENTITY_SCAN = re.compile(
    r"\b(?:(?P<payment_id>(?:credit_card|gift_card|certificate)_[0-9]+)|(?P<user_id>[a-z]+_[a-z]+_[0-9]+)"
    r"|(?P<reservation_id>[A-Z0-9]{6})|(?P<date>\d{4}-\d{2}-\d{2}))\b"
)
_FLIGHT = re.compile(r"[A-Z]{3}[0-9]{3}")
_ALSO_USER = re.compile(r"[a-z]+_[a-z]+_[0-9]+")


def extract_entities(observation: str) -> dict[str, tuple[str, ...]]:
    """Entity strings in a tool observation, by kind (never run on user messages)."""
    found: dict[str, list[str]] = {}
    for m in _ENTITY_SCAN.finditer(observation):
        kind, text = m.lastgroup, m.group()
        found.setdefault(kind, []).append(text)
        if kind == "reservation_id" and _FLIGHT.fullmatch(text):
            found.setdefault("flight_number", []).append(text)
        elif kind == "payment_id":
            found.setdefault("user_id", []).append(text)
    return {k: tuple(v) for k, v in found.items()}


@dataclass(frozen=True)
class ActionEntry:
    """One entry of the action history. `turn` is the index of the assistant turn it came from (-1 if unknown);
    `call` the index of the call inside that turn."""

    tool: str
    params: Mapping[str, Any] = field(default_factory=dict)
    is_error: bool = False
    entities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    content: str = ""
    turn: int = -1
    call: int = 0
    param_str: str | None = None  # None = canonical_param_str(params); the original tests stored other strings
    #: Call signature for the redundancy / error-repetition rules, computed once from this entry alone (like the
    #: original's stored param_str): (tool, `param_str`, else the lower-cased sorted-key JSON of the arguments).
    key: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ps = self.param_str if self.param_str is not None else canonical_param_str(self.params)
        object.__setattr__(self, "key", (self.tool, ps))

    @property
    def signature(self) -> tuple[str, str]:
        return self.key


@dataclass(frozen=True)
class HistoryStats:
    """Tool calls that never reached the history (method.md h.16)."""

    num_unknown_tool_calls: int = 0
    num_unparsed_tool_calls: int = 0


def build_action_history(
    trajectory: Any, params: RuleParams = DEFAULT_PARAMS, *, seed_compat: bool = False
) -> tuple[list[ActionEntry], HistoryStats]:
    """The action history of a `longhaul.envs.trajectory.Trajectory` (or its dict form), as method.md a.1.

    Executed calls (known tool, arguments parsed to an object) become entries, in order; an error observation
    sets `is_error` and skips entity extraction. A message to the user longer than `implicit_think.min_chars`
    becomes an `implicit_think` entry holding its first `keep_chars` characters, unless the previous entry is an
    identical implicit_think. Calls to unknown tools and unparsable calls are only counted. With `seed_compat`
    tool-call entries carry no assistant text: the original's production history never had it (so P9 never
    fired there).
    """
    turns = trajectory["turns"] if isinstance(trajectory, Mapping) else trajectory.turns
    min_chars = params.get("implicit_think", "min_chars")
    keep = int(params.get("implicit_think", "keep_chars"))
    history: list[ActionEntry] = []
    unknown = unparsed = 0
    for turn in turns:
        t = _as_mapping(turn)
        content = t.get("content") or ""
        call_content = "" if seed_compat else content
        calls = t.get("tool_calls") or []
        for ci, call in enumerate(calls):
            c = _as_mapping(call)
            args = c.get("arguments")
            if c.get("parse_error") is not None or not isinstance(args, Mapping):
                unparsed += 1
                continue
            if not c.get("known_tool", True):
                unknown += 1
                continue
            err = bool(c.get("is_error", False))
            obs = c.get("result") or ""
            history.append(
                ActionEntry(
                    tool=c["name"],
                    params=dict(args),
                    is_error=err,
                    entities={} if err else extract_entities(obs),
                    content=call_content,
                    turn=int(t["index"]),
                    call=ci,
                )
            )
        if not calls and t.get("to_user") and len(content) > min_chars and params.enabled("implicit_think"):
            text = content[:keep]
            last = history[-1] if history else None
            if last is None or last.tool != IMPLICIT_THINK or last.content != text:
                history.append(
                    ActionEntry(tool=IMPLICIT_THINK, params={}, content=text, turn=int(t["index"]), param_str="")
                )
    return history, HistoryStats(unknown, unparsed)


def _as_mapping(obj: Any) -> Mapping[str, Any]:
    if isinstance(obj, Mapping):
        return obj
    return obj.__dict__ if hasattr(obj, "__dict__") else {f: getattr(obj, f) for f in obj.__dataclass_fields__}


# ---------------------------------------------------------------------------------------------------------
# Result


class RuleHit(NamedTuple):
    """One rule that fired: its name, the weight it added and a short detail (e.g. the chained entity)."""

    rule: str
    weight: float
    detail: str = ""


class StepResult(NamedTuple):
    """The rules that fired on one history entry and their sum."""

    index: int
    tool: str
    turn: int
    hits: tuple[RuleHit, ...]
    score: float


@dataclass(frozen=True)
class PrmLiteResult:
    """Per-step hits, trajectory-level hits, the unclipped and clipped process score and per-turn scores.

    `turn_scores[k]` is turn k's share of the process score: the sum of its entries' step scores divided by the
    number of entries, plus — on the last turn — the trajectory-level adjustments and the clip correction, so
    that ``sum(turn_scores) == process`` exactly (see `longhaul.rewards.combine`)."""

    steps: tuple[StepResult, ...]
    trajectory_hits: tuple[RuleHit, ...]
    mean_step_score: float
    raw: float
    process: float
    turn_scores: tuple[float, ...]
    num_unknown_tool_calls: int = 0
    num_unparsed_tool_calls: int = 0

    def rule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.steps:
            for h in s.hits:
                counts[h.rule] = counts.get(h.rule, 0) + 1
        for h in self.trajectory_hits:
            counts[h.rule] = counts.get(h.rule, 0) + 1
        return counts


# ---------------------------------------------------------------------------------------------------------
# Scoring


@lru_cache(maxsize=65536)
def _is_placeholder_value(name: str, value: str, seed_compat: bool) -> bool:
    lower = value.lower()
    if seed_compat:
        if any(kw in lower for kw in PLACEHOLDER_KEYWORDS):
            return True
        lname = name.lower()
        for key, pat in SCHEMA_PATTERNS.items():
            if key in lname:
                return not pat.match(value)  # the original's check, quirk included: `$` lets a trailing newline by
        return False
    words = _WORD.findall(lower.replace("_", " "))
    if len(words) <= _MAX_PLACEHOLDER_WORDS and any(w in PLACEHOLDER_KEYWORDS for w in words):
        return True
    lname = name.lower()
    for key, pat in SCHEMA_PATTERNS.items():
        if lname == key or lname.endswith("_" + key):
            return not pat.fullmatch(value)
    return False


def has_placeholder(params: Mapping[str, Any], seed_compat: bool = False) -> bool:
    """True if any top-level string argument is a placeholder (nested lists are not checked)."""
    for k, v in params.items():
        if isinstance(v, str) and _is_placeholder_value(k, v, seed_compat):
            return True
    return False


def score_prm_lite(
    history: Sequence[ActionEntry],
    params: RuleParams = DEFAULT_PARAMS,
    *,
    seed_compat: bool = False,
    num_turns: int | None = None,
    stats: HistoryStats | None = None,
) -> PrmLiteResult:
    """Score an action history. `num_turns` (the trajectory's assistant turns) sizes `turn_scores`; by default
    it is one more than the highest turn index in the history."""
    n = len(history)
    stats = stats or HistoryStats()
    if num_turns is None:
        num_turns = max((e.turn for e in history), default=-1) + 1
    read_tools = SEED_READ_TOOLS if seed_compat else READ_TOOLS
    P = params
    on = {r: P.enabled(r) for r in (*STEP_RULES, *TRAJECTORY_RULES)}
    window = int(P.get("redundancy", "window"))
    # Weights as locals: this loop runs for every rollout of every training step.
    w_ph_r, w_ph_w = P.get("placeholder", "read_weight"), P.get("placeholder", "write_weight")
    w_red = P.get("redundancy", "weight")
    w_rep, w_rec = P.get("error_repetition", "weight"), P.get("recovery", "weight")
    w_esc_p, w_esc_l = P.get("escalation", "premature_weight"), P.get("escalation", "late_weight")
    w_dc_r, w_dc_w = P.get("data_chain", "read_weight"), P.get("data_chain", "write_weight")
    w_fr, w_th = P.get("first_read", "weight"), P.get("think_bonus", "weight")
    w_cheap, cheap_min = P.get("cheap_reasoning", "weight"), P.get("cheap_reasoning", "min_chars")
    on_ph, on_red, on_rep, on_rec = on["placeholder"], on["redundancy"], on["error_repetition"], on["recovery"]
    on_esc, on_dc, on_fr, on_th, on_cheap = (
        on["escalation"],
        on["data_chain"],
        on["first_read"],
        on["think_bonus"],
        on["cheap_reasoning"],
    )

    # Each entry's own signature (`ActionEntry.key`). The original's redundancy check compared the stored
    # strings of earlier entries with the JSON of the current call's arguments; the two differ only where a
    # caller supplied its own `param_str` (the original tests' convention), so seed_compat recomputes exactly there.
    sigs = [e.key for e in history]
    if seed_compat:
        cur_sigs = [e.key if e.param_str is None else (e.tool, canonical_param_str(e.params)) for e in history]
    else:
        cur_sigs = sigs
    is_think = [e.tool in THINK_TOOLS for e in history]
    # The consecutive-think exception: in default mode only an explicit `think` is "the previous think" (module
    # docstring, fix 5); the original counted implicit_think too.
    blocks_next_think = is_think if seed_compat else [e.tool == "think" for e in history]
    ph_any = [bool(e.params) and has_placeholder(e.params, seed_compat) for e in history]

    def redundant(i: int, sig: tuple[str, Any]) -> bool:
        if seed_compat:
            for j in range(max(0, i - window), i):
                if not is_think[j] and sigs[j] == sig:
                    return True
            return False
        seen = 0
        j = i - 1
        while j >= 0 and seen < window:
            if not is_think[j]:
                if sigs[j] == sig:
                    return True
                seen += 1
            j -= 1
        return False

    # Hits with a fixed weight and detail are built once and shared (this loop runs for every rollout).
    H_TH, H_RED = RuleHit("think_bonus", w_th), RuleHit("redundancy", w_red)
    H_PH_W, H_PH_R = RuleHit("placeholder", w_ph_w), RuleHit("placeholder", w_ph_r)
    H_REP, H_REC = RuleHit("error_repetition", w_rep), RuleHit("recovery", w_rec)
    H_ESC_L, H_ESC_P = RuleHit("escalation", w_esc_l, "late"), RuleHit("escalation", w_esc_p, "premature")
    H_FR, H_CHEAP = RuleHit("first_read", w_fr), RuleHit("cheap_reasoning", w_cheap)
    new_step = tuple.__new__
    steps: list[StepResult] = []
    seen_entities: set[str] = set()
    seen_reads: set[str] = set()
    total = 0.0
    any_think = False
    for i in range(n):
        e = history[i]
        tool = e.tool
        hits: list[RuleHit] = []
        if is_think[i]:
            any_think = True
            if (
                on_th
                and (seed_compat or tool != IMPLICIT_THINK)
                and i != n - 1
                and not (i >= 1 and blocks_next_think[i - 1])
            ):
                if not (ph_any[i + 1] or redundant(i + 1, cur_sigs[i + 1])):
                    hits.append(H_TH)
        else:
            write = tool in WRITE_TOOLS
            if on_ph and ph_any[i]:
                hits.append(H_PH_W if write else H_PH_R)
            if on_red and redundant(i, cur_sigs[i]):
                hits.append(H_RED)
            if i >= 1 and history[i - 1].is_error:
                if sigs[i] == sigs[i - 1]:
                    if on_rep:
                        hits.append(H_REP)
                elif on_rec:
                    hits.append(H_REC)
            if on_esc and tool in ESCALATION_TOOLS:
                hits.append(H_ESC_L if seen_reads else H_ESC_P)
            if on_dc and seen_entities and i >= 1 and e.params:
                for v in e.params.values():
                    if type(v) is str and v in seen_entities:
                        hits.append(RuleHit("data_chain", w_dc_w if write else w_dc_r, v))
                        break
            if on_fr and tool in read_tools and tool not in seen_reads:
                hits.append(H_FR)
            if on_cheap and 0 < len(e.content) < cheap_min:
                hits.append(H_CHEAP)
        # Rule by rule, in the original's order; the mean's numerator left to right (the original's `sum` on
        # Python 3.10; not `sum()` here, which compensates from Python 3.12 on).
        score = 0.0
        for h in hits:
            score += h[1]
        total += score
        steps.append(new_step(StepResult, (i, tool, e.turn, tuple(hits), score)))
        if tool in read_tools:
            seen_reads.add(tool)
        if e.entities:
            for ents in e.entities.values():
                seen_entities.update(ents)

    mean = total / n if n else 0.0
    traj_hits: list[RuleHit] = []
    if n:
        if on["no_reasoning"] and not any_think and n >= P.get("no_reasoning", "min_steps"):
            traj_hits.append(RuleHit("no_reasoning", P.get("no_reasoning", "weight")))
        if on["read_diversity"] and len(seen_reads) >= P.get("read_diversity", "min_distinct"):
            traj_hits.append(RuleHit("read_diversity", P.get("read_diversity", "weight"), str(len(seen_reads))))
        thr = P.get("length_penalty", "threshold")
        if on["length_penalty"] and n > thr:
            traj_hits.append(RuleHit("length_penalty", P.get("length_penalty", "per_step") * (n - thr), str(n)))
    bad_calls = stats.num_unknown_tool_calls + stats.num_unparsed_tool_calls
    if not seed_compat and on["unknown_tool"] and bad_calls and P.get("unknown_tool", "weight") != 0.0:
        traj_hits.append(RuleHit("unknown_tool", P.get("unknown_tool", "weight") * bad_calls, str(bad_calls)))
    # The original's order: ((mean + P5) + B7) + P8, one addition at a time (mean + their sum rounds differently).
    raw = mean
    for h in traj_hits:
        raw += h.weight
    clip = P.get("aggregate", "clip")
    process = float(max(-clip, min(clip, raw)))

    turn_scores = [0.0] * max(num_turns, 1 if (n or traj_hits) else 0)
    if n:
        last = len(turn_scores) - 1
        for s in steps:
            if s.score:
                k = s.turn if 0 <= s.turn <= last else last
                turn_scores[k] += s.score / n
    if turn_scores:
        turn_scores[-1] += process - sum(turn_scores)
    return PrmLiteResult(
        steps=tuple(steps),
        trajectory_hits=tuple(traj_hits),
        mean_step_score=mean,
        raw=raw,
        process=process,
        turn_scores=tuple(turn_scores),
        num_unknown_tool_calls=stats.num_unknown_tool_calls,
        num_unparsed_tool_calls=stats.num_unparsed_tool_calls,
    )


def score_trajectory(
    trajectory: Any, params: RuleParams = DEFAULT_PARAMS, *, seed_compat: bool = False
) -> PrmLiteResult:
    """`build_action_history` + `score_prm_lite` for a Trajectory (or its dict form)."""
    history, stats = build_action_history(trajectory, params, seed_compat=seed_compat)
    turns = trajectory["turns"] if isinstance(trajectory, Mapping) else trajectory.turns
    return score_prm_lite(history, params, seed_compat=seed_compat, num_turns=len(turns), stats=stats)


def iter_rule_names() -> Iterable[str]:
    return (*STEP_RULES, *TRAJECTORY_RULES)
