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

The rule names and the parameter table are in `longhaul.rewards.prm_lite_settings`, the action history in
`longhaul.rewards.prm_lite_history`, the tool classes and the placeholder check in `longhaul.rewards.prm_lite_vocab`;
their public names are importable from here too (`__all__`).

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from longhaul.envs.airline.toolnames import WRITE_TOOLS
from longhaul.rewards.prm_lite_history import (
    ENTITY_PATTERNS,
    IMPLICIT_THINK,
    ActionEntry,
    HistoryStats,
    build_action_history,
    canonical_param_str,
    extract_entities,
)
from longhaul.rewards.prm_lite_settings import (
    DEFAULT_PARAMS,
    STEP_RULES,
    TRAJECTORY_RULES,
    RuleParams,
    build_rule_params,
)
from longhaul.rewards.prm_lite_vocab import (
    ESCALATION_TOOLS,
    PLACEHOLDER_KEYWORDS,
    READ_TOOLS,
    SCHEMA_PATTERNS,
    SEED_READ_TOOLS,
    THINK_TOOLS,
    has_placeholder,
)

__all__ = [
    "DEFAULT_PARAMS",
    "ENTITY_PATTERNS",
    "ESCALATION_TOOLS",
    "IMPLICIT_THINK",
    "PLACEHOLDER_KEYWORDS",
    "READ_TOOLS",
    "SCHEMA_PATTERNS",
    "SEED_READ_TOOLS",
    "STEP_RULES",
    "THINK_TOOLS",
    "TRAJECTORY_RULES",
    "WRITE_TOOLS",
    "ActionEntry",
    "HistoryStats",
    "PrmLiteResult",
    "RuleHit",
    "RuleParams",
    "StepResult",
    "build_action_history",
    "build_rule_params",
    "canonical_param_str",
    "extract_entities",
    "has_placeholder",
    "iter_rule_names",
    "score_prm_lite",
    "score_trajectory",
]

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
    walk = _StepWalk(history, params, seed_compat)
    steps = walk.run()
    mean = walk.total / n if n else 0.0
    traj_hits = _trajectory_hits(n, walk, stats, params, seed_compat)
    # The original's order: ((mean + P5) + B7) + P8, one addition at a time (mean + their sum rounds differently).
    raw = mean
    for h in traj_hits:
        raw += h.weight
    clip = params.get("aggregate", "clip")
    process = float(max(-clip, min(clip, raw)))
    return PrmLiteResult(
        steps=tuple(steps),
        trajectory_hits=tuple(traj_hits),
        mean_step_score=mean,
        raw=raw,
        process=process,
        turn_scores=_turn_scores(steps, num_turns, process, bool(traj_hits)),
        num_unknown_tool_calls=stats.num_unknown_tool_calls,
        num_unparsed_tool_calls=stats.num_unparsed_tool_calls,
    )


class _StepWalk:
    """One pass over an action history scoring every entry with the step rules, rule by rule in the original's order.

    What the rules read more than once is prepared up front, since this runs for every rollout of every training
    step: the switches, the weights and the hits with a fixed weight and detail (built once and shared), each
    entry's call signature, whether it is a think and whether it holds a placeholder. After `run`: `total`, the sum
    of the step scores; `any_think`; `seen_reads`, the distinct read tools called."""

    def __init__(self, history: Sequence[ActionEntry], P: RuleParams, seed_compat: bool) -> None:
        self.history = history
        self.seed_compat = seed_compat
        self.read_tools = SEED_READ_TOOLS if seed_compat else READ_TOOLS
        self.window = int(P.get("redundancy", "window"))
        self.on_ph, self.on_red = P.enabled("placeholder"), P.enabled("redundancy")
        self.on_rep, self.on_rec = P.enabled("error_repetition"), P.enabled("recovery")
        self.on_esc, self.on_dc = P.enabled("escalation"), P.enabled("data_chain")
        self.on_fr, self.on_th, self.on_cheap = (
            P.enabled("first_read"),
            P.enabled("think_bonus"),
            P.enabled("cheap_reasoning"),
        )
        self.w_dc_r, self.w_dc_w = P.get("data_chain", "read_weight"), P.get("data_chain", "write_weight")
        self.cheap_min = P.get("cheap_reasoning", "min_chars")
        self.hit_think = RuleHit("think_bonus", P.get("think_bonus", "weight"))
        self.hit_redundant = RuleHit("redundancy", P.get("redundancy", "weight"))
        self.hit_placeholder_write = RuleHit("placeholder", P.get("placeholder", "write_weight"))
        self.hit_placeholder_read = RuleHit("placeholder", P.get("placeholder", "read_weight"))
        self.hit_repetition = RuleHit("error_repetition", P.get("error_repetition", "weight"))
        self.hit_recovery = RuleHit("recovery", P.get("recovery", "weight"))
        self.hit_late_escalation = RuleHit("escalation", P.get("escalation", "late_weight"), "late")
        self.hit_premature_escalation = RuleHit("escalation", P.get("escalation", "premature_weight"), "premature")
        self.hit_first_read = RuleHit("first_read", P.get("first_read", "weight"))
        self.hit_cheap = RuleHit("cheap_reasoning", P.get("cheap_reasoning", "weight"))
        # Each entry's own signature (`ActionEntry.key`). The original's redundancy check compared the stored
        # strings of earlier entries with the JSON of the current call's arguments; the two differ only where a
        # caller supplied its own `param_str` (the original tests' convention), so seed_compat recomputes exactly
        # there.
        self.sigs = [e.key for e in history]
        if seed_compat:
            self.cur_sigs = [e.key if e.param_str is None else (e.tool, canonical_param_str(e.params)) for e in history]
        else:
            self.cur_sigs = self.sigs
        self.is_think = [e.tool in THINK_TOOLS for e in history]
        # The consecutive-think exception: in default mode only an explicit `think` is "the previous think" (module
        # docstring, fix 5); the original counted implicit_think too.
        self.blocks_next_think = self.is_think if seed_compat else [e.tool == "think" for e in history]
        self.ph_any = [bool(e.params) and has_placeholder(e.params, seed_compat) for e in history]
        self.seen_entities: set[str] = set()
        self.seen_reads: set[str] = set()
        self.total = 0.0
        self.any_think = False

    def run(self) -> list[StepResult]:
        """Score every entry in order; what an entry reads and calls counts from the next entry on."""
        history, is_think, read_tools = self.history, self.is_think, self.read_tools
        new_step = tuple.__new__
        steps: list[StepResult] = []
        for i in range(len(history)):
            e = history[i]
            tool = e.tool
            if is_think[i]:
                self.any_think = True
                hits = self._think_hits(i, tool)
            else:
                hits = self._call_hits(i, e)
            # Rule by rule, in the original's order; the mean's numerator left to right (the original's `sum` on
            # Python 3.10; not `sum()` here, which compensates from Python 3.12 on).
            score = 0.0
            for h in hits:
                score += h[1]
            self.total += score
            steps.append(new_step(StepResult, (i, tool, e.turn, tuple(hits), score)))
            if tool in read_tools:
                self.seen_reads.add(tool)
            if e.entities:
                for ents in e.entities.values():
                    self.seen_entities.update(ents)
        return steps

    def _think_hits(self, i: int, tool: str) -> list[RuleHit]:
        """The think bonus: for a think before a clean call (no placeholder, not redundant), unless it follows
        another think (a chain is paid once) or is an implicit think outside seed_compat (module docstring, fix 4)."""
        if (
            self.on_th
            and (self.seed_compat or tool != IMPLICIT_THINK)
            and i != len(self.history) - 1
            and not (i >= 1 and self.blocks_next_think[i - 1])
        ):
            if not (self.ph_any[i + 1] or self._redundant(i + 1, self.cur_sigs[i + 1])):
                return [self.hit_think]
        return []

    def _call_hits(self, i: int, e: ActionEntry) -> list[RuleHit]:
        """The step rules of a tool call, in the original's order."""
        tool = e.tool
        hits: list[RuleHit] = []
        write = tool in WRITE_TOOLS
        if self.on_ph and self.ph_any[i]:
            hits.append(self.hit_placeholder_write if write else self.hit_placeholder_read)
        if self.on_red and self._redundant(i, self.cur_sigs[i]):
            hits.append(self.hit_redundant)
        if i >= 1 and self.history[i - 1].is_error:
            if self.sigs[i] == self.sigs[i - 1]:
                if self.on_rep:
                    hits.append(self.hit_repetition)
            elif self.on_rec:
                hits.append(self.hit_recovery)
        if self.on_esc and tool in ESCALATION_TOOLS:
            hits.append(self.hit_late_escalation if self.seen_reads else self.hit_premature_escalation)
        if self.on_dc and self.seen_entities and i >= 1 and e.params:
            for v in e.params.values():
                if type(v) is str and v in self.seen_entities:
                    hits.append(RuleHit("data_chain", self.w_dc_w if write else self.w_dc_r, v))
                    break
        if self.on_fr and tool in self.read_tools and tool not in self.seen_reads:
            hits.append(self.hit_first_read)
        if self.on_cheap and 0 < len(e.content) < self.cheap_min:
            hits.append(self.hit_cheap)
        return hits

    def _redundant(self, i: int, sig: tuple[str, Any]) -> bool:
        """Whether `sig` is among the `window` entries before `i`: in seed_compat the last `window` entries (thinks
        use up the window without matching), otherwise the last `window` tool calls (module docstring, fix 3)."""
        sigs, is_think, window = self.sigs, self.is_think, self.window
        if self.seed_compat:
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


def _trajectory_hits(n: int, walk: _StepWalk, stats: HistoryStats, P: RuleParams, seed_compat: bool) -> list[RuleHit]:
    """The rules evaluated once per trajectory, in the original's order (P5 no reasoning, B7 read diversity, P8
    length), then the calls that never reached the history (default mode only)."""
    traj_hits: list[RuleHit] = []
    if n:
        if P.enabled("no_reasoning") and not walk.any_think and n >= P.get("no_reasoning", "min_steps"):
            traj_hits.append(RuleHit("no_reasoning", P.get("no_reasoning", "weight")))
        seen_reads = walk.seen_reads
        if P.enabled("read_diversity") and len(seen_reads) >= P.get("read_diversity", "min_distinct"):
            traj_hits.append(RuleHit("read_diversity", P.get("read_diversity", "weight"), str(len(seen_reads))))
        thr = P.get("length_penalty", "threshold")
        if P.enabled("length_penalty") and n > thr:
            traj_hits.append(RuleHit("length_penalty", P.get("length_penalty", "per_step") * (n - thr), str(n)))
    bad_calls = stats.num_unknown_tool_calls + stats.num_unparsed_tool_calls
    if not seed_compat and P.enabled("unknown_tool") and bad_calls and P.get("unknown_tool", "weight") != 0.0:
        traj_hits.append(RuleHit("unknown_tool", P.get("unknown_tool", "weight") * bad_calls, str(bad_calls)))
    return traj_hits


def _turn_scores(steps: list[StepResult], num_turns: int, process: float, traj_hits: bool) -> tuple[float, ...]:
    """Each turn's share of the process score: its entries' step scores over the number of entries (an entry of
    no known turn counts on the last), and on the last turn the rest, so that the shares sum to `process`."""
    n = len(steps)
    turn_scores = [0.0] * max(num_turns, 1 if (n or traj_hits) else 0)
    if n:
        last = len(turn_scores) - 1
        for s in steps:
            if s.score:
                k = s.turn if 0 <= s.turn <= last else last
                turn_scores[k] += s.score / n
    if turn_scores:
        turn_scores[-1] += process - sum(turn_scores)
    return tuple(turn_scores)


def score_trajectory(
    trajectory: Any, params: RuleParams = DEFAULT_PARAMS, *, seed_compat: bool = False
) -> PrmLiteResult:
    """`build_action_history` + `score_prm_lite` for a Trajectory (or its dict form)."""
    history, stats = build_action_history(trajectory, params, seed_compat=seed_compat)
    turns = trajectory["turns"] if isinstance(trajectory, Mapping) else trajectory.turns
    return score_prm_lite(history, params, seed_compat=seed_compat, num_turns=len(turns), stats=stats)


def iter_rule_names() -> Iterable[str]:
    """Every rule's name: the step rules, then the trajectory rules."""
    return (*STEP_RULES, *TRAJECTORY_RULES)
