"""PRM-Lite rule parameters: names, defaults and meaning (pure data, no logic).

This table is the single place where PRM-Lite's weights and thresholds are defined. The spec
(`spec.reward.rules`) may override any parameter by rule name; the rule engine (`longhaul.rewards.prm_lite`) reads
the merged table. It lives in the spec package, below the rule engine, because the spec validates the overrides
against it (`longhaul.spec.rules`). Values are the original "v4-optimal" numbers (see shared notes, method.md
section a.2).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import NamedTuple

#: rule name -> {parameter name -> default value}. Every rule also accepts ``enabled`` (bool, default True).
RULE_DEFAULTS: MappingProxyType[str, MappingProxyType[str, float]] = MappingProxyType(
    {
        # P1: a top-level string argument that is a placeholder (keyword or schema mismatch).
        "placeholder": MappingProxyType({"read_weight": -0.03, "write_weight": -0.05}),
        # P2: identical (tool, canonical args) among the last `window` history entries.
        "redundancy": MappingProxyType({"weight": -0.03, "window": 3}),
        # P3: the same call repeated right after it returned an error.
        "error_repetition": MappingProxyType({"weight": -0.04}),
        # P3 "recovery": a different call right after an error.
        "recovery": MappingProxyType({"weight": 0.05}),
        # P4: transfer_to_human_agents before any read (premature) or after reads (late).
        "escalation": MappingProxyType({"premature_weight": -0.10, "late_weight": -0.05}),
        # B1: an argument equal to an entity extracted from an earlier tool observation.
        "data_chain": MappingProxyType({"read_weight": 0.04, "write_weight": 0.08}),
        # B2: first use of a READ tool in the trajectory.
        "first_read": MappingProxyType({"weight": 0.01}),
        # B4/B5: a think step that is followed by a clean action.
        "think_bonus": MappingProxyType({"weight": 0.01}),
        # P9: assistant text shorter than `min_chars` (but not empty) accompanying a tool call.
        "cheap_reasoning": MappingProxyType({"weight": -0.02, "min_chars": 30}),
        # P5 (trajectory): no think / implicit-think entry and at least `min_steps` entries.
        "no_reasoning": MappingProxyType({"weight": -0.05, "min_steps": 3}),
        # B7 (trajectory): at least `min_distinct` distinct READ tools used.
        "read_diversity": MappingProxyType({"weight": 0.01, "min_distinct": 3}),
        # P8 (trajectory): `per_step` for every history entry beyond `threshold`.
        "length_penalty": MappingProxyType({"per_step": -0.01, "threshold": 8}),
        # Pseudo-entries for assistant messages to the user longer than `min_chars` (first `keep_chars` kept).
        "implicit_think": MappingProxyType({"min_chars": 100, "keep_chars": 300}),
        # Calls to unknown (hallucinated) tools or with unparsable arguments: `weight` per call, trajectory
        # level, default mode only. 0 = counted in metrics but not scored (the original never saw them).
        "unknown_tool": MappingProxyType({"weight": 0.0}),
        # Aggregation: process score clipped to [-clip, +clip].
        "aggregate": MappingProxyType({"clip": 0.5}),
    }
)

RULE_NAMES: tuple[str, ...] = tuple(RULE_DEFAULTS)


class ParamDomain(NamedTuple):
    """What one parameter may be: its type (`int`: a whole number of history entries, characters or tools;
    `float`: a score), the lowest and highest value, and whether the lowest is excluded."""

    type: type
    low: float
    high: float
    low_open: bool = False


#: A per-hit score of either sign: the defaults are a few hundredths; a process score is clipped to ±clip anyway.
WEIGHT = ParamDomain(float, -1.0, 1.0)
#: A whole number of history entries, steps or tools.
ENTRIES = ParamDomain(int, 0, 10_000)
#: A whole number of characters.
CHARS = ParamDomain(int, 0, 1_000_000)

#: rule name -> {parameter name -> its domain}: every parameter of `RULE_DEFAULTS`, typed and bounded. The spec
#: builds its per-rule models from this table (`longhaul.spec.rules`).
PARAM_DOMAINS: MappingProxyType[str, MappingProxyType[str, ParamDomain]] = MappingProxyType(
    {
        "placeholder": MappingProxyType({"read_weight": WEIGHT, "write_weight": WEIGHT}),
        # window 0 would compare with nothing (and a slice [-0:] with the whole history): at least one entry.
        "redundancy": MappingProxyType({"weight": WEIGHT, "window": ParamDomain(int, 1, 1_000)}),
        "error_repetition": MappingProxyType({"weight": WEIGHT}),
        "recovery": MappingProxyType({"weight": WEIGHT}),
        "escalation": MappingProxyType({"premature_weight": WEIGHT, "late_weight": WEIGHT}),
        "data_chain": MappingProxyType({"read_weight": WEIGHT, "write_weight": WEIGHT}),
        "first_read": MappingProxyType({"weight": WEIGHT}),
        "think_bonus": MappingProxyType({"weight": WEIGHT}),
        "cheap_reasoning": MappingProxyType({"weight": WEIGHT, "min_chars": CHARS}),
        "no_reasoning": MappingProxyType({"weight": WEIGHT, "min_steps": ENTRIES}),
        "read_diversity": MappingProxyType({"weight": WEIGHT, "min_distinct": ENTRIES}),
        "length_penalty": MappingProxyType({"per_step": WEIGHT, "threshold": ENTRIES}),
        "implicit_think": MappingProxyType({"min_chars": CHARS, "keep_chars": CHARS}),
        "unknown_tool": MappingProxyType({"weight": WEIGHT}),
        # A clip of 0 silences the process reward, a negative one turns every penalty into the full bonus.
        "aggregate": MappingProxyType({"clip": ParamDomain(float, 0.0, 10.0, low_open=True)}),
    }
)
