"""What `longhaul explain` shows: PRM-Lite rule hits per turn, the reward, and each estimator's token advantages.

Pure: takes trajectory dicts (the episode runner's JSON records) and an Experiment; returns a plain dict.

With ``credit: turn`` every turn also carries the estimator's per-turn credit (`longhaul.algos.estimators`,
module docstring): the share read back from the reward row, the baseline b_{g,k} (mean share of turn k over the
group's trajectories that have a turn k, and how many do) and the turn's advantage a_i + d_{i,k} before the
estimators' multipliers; every trajectory carries its trajectory-level reward o_i and term a_i.

Token layout. A trajectory record keeps token *counts* for assistant turns (`Turn.completion_tokens`) but not
for tool results or user replies; those are estimated at 4 characters per token (at least 1) to place the
mask-0 gaps between turns, which only matters for the token-unit discount. Trajectories given together form
one GRPO group (pass the rollouts of one task) unless `groups` gives each a group key (rollout traces carry
veRL's `uid`; a None key joins the shared default group); a group of one keeps its raw score (veRL's
normalisation: mean 0, std 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from longhaul.algos.estimators import ADVANTAGES, TurnCredit, compute_advantages, compute_turn_credit
from longhaul.algos.settings import estimator_name, settings_from_spec
from longhaul.rewards.combine import RewardSettings, build_token_rewards
from longhaul.rewards.prm_lite import PrmLiteResult, build_rule_params, score_trajectory

CHARS_PER_TOKEN = 4


def _v(x: Any) -> Any:
    return getattr(x, "value", x)


def build_token_layout(traj: Mapping[str, Any]) -> tuple[list[int], list[tuple[int, int]]]:
    """A response mask for a trajectory record and the (start, end) token span of every assistant turn."""
    mask: list[int] = []
    spans: list[tuple[int, int]] = []
    for t in traj["turns"]:
        n = int(t.get("completion_tokens") or 0) or max(1, len(t.get("content") or "") // CHARS_PER_TOKEN)
        spans.append((len(mask), len(mask) + n))
        mask.extend([1] * n)
        gap = sum(len(c.get("result") or "") for c in t.get("tool_calls") or [])
        if gap or t is not traj["turns"][-1]:
            mask.extend([0] * max(1, gap // CHARS_PER_TOKEN))
    return mask, spans


def build_explanation(
    trajectories: Sequence[Mapping[str, Any]], exp: Any, groups: Sequence[Any] | None = None
) -> dict[str, Any]:
    """Rule hits, per-turn scores, rewards and per-turn advantage summaries for a group of trajectories (or for
    several groups: `groups` holds one hashable key per trajectory)."""
    if groups is not None and len(groups) != len(trajectories):
        raise ValueError(f"groups has {len(groups)} keys for {len(trajectories)} trajectories")
    index = ["group" if groups is None or g is None else f"uid:{g}" for g in (groups or [None] * len(trajectories))]
    alg = exp.spec.algorithm
    reward_settings = RewardSettings.from_spec(exp)
    params = build_rule_params(reward_settings.rules)
    credit = reward_settings.credit
    settings = settings_from_spec(exp)

    items, rows, masks, spans_all = [], [], [], []
    for traj in trajectories:
        item, row, mask, spans = _explain_trajectory(traj, index[len(items)], reward_settings, params)
        items.append(item)
        rows.append(row)
        masks.append(mask)
        spans_all.append(spans)

    T = max((len(m) for m in masks), default=0)
    if T:
        r = torch.zeros(len(items), T)
        m = torch.zeros(len(items), T, dtype=torch.long)
        for i, (row, mk) in enumerate(zip(rows, masks, strict=True)):
            r[i, : len(row)] = torch.tensor(row)
            m[i, : len(mk)] = torch.tensor(mk)
        if credit == "turn":
            _add_turn_credit(items, compute_turn_credit(r, m, index, norm_by_std=bool(alg.norm_adv_by_std)))
        for adv in ADVANTAGES:
            a, _ = compute_advantages(
                r,
                m,
                index,
                advantage=adv,
                alpha=settings["alpha"],
                discount_unit=settings["discount_unit"],
                length_exponent=settings["length_exponent"],
                seed_compat=reward_settings.seed_compat,
                credit=credit,
                norm_by_std=bool(alg.norm_adv_by_std),
            )
            for i, spans in enumerate(spans_all):
                items[i]["advantages"][adv] = _per_turn_summary(a[i], spans)
    return {
        "estimator": estimator_name(exp),
        "settings": {
            **settings,
            "norm_adv_by_std": bool(alg.norm_adv_by_std),
            "loss_agg_mode": _v(alg.loss_agg_mode),
            "weight": reward_settings.weight,
            "process": reward_settings.process,
        },
        "group_size": len(items),
        "num_groups": len(set(index)),
        "trajectories": items,
    }


def _explain_trajectory(
    traj: Mapping[str, Any], group: str, reward_settings: RewardSettings, params: Any
) -> tuple[dict[str, Any], list[float], list[int], list[tuple[int, int]]]:
    """One trajectory's explanation (its `advantages` filled in later), its token reward row, mask and turn spans."""
    # scored whatever `process` says: the rule hits are shown even when they do not enter the reward
    prm = score_trajectory(traj, params, seed_compat=reward_settings.seed_compat)
    grade = traj.get("grade") or {}
    outcome = 1.0 if grade.get("success") else 0.0
    reward = reward_settings.combine(outcome, prm)
    mask, spans = build_token_layout(traj)
    row = build_token_rewards(reward, mask, reward_settings.credit) if mask else []
    item = {
        "group": group,
        "task_id": traj.get("task_id"),
        "trial": traj.get("trial"),
        "termination": traj.get("termination"),
        "outcome": outcome,
        "process": prm.process,
        "process_raw": prm.raw,
        "mean_step_score": prm.mean_step_score,
        "process_in_reward": reward_settings.process_on,
        "reward": reward.score,
        "trajectory_hits": [{"rule": h.rule, "weight": h.weight, "detail": h.detail} for h in prm.trajectory_hits],
        "unknown_tool_calls": prm.num_unknown_tool_calls,
        "unparsed_tool_calls": prm.num_unparsed_tool_calls,
        "turns": _explain_turns(traj, prm, spans),
        "advantages": {},
    }
    return item, row, mask, spans


def _explain_turns(traj: Mapping[str, Any], prm: PrmLiteResult, spans: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Each assistant turn: what it said and called, the PRM-Lite steps it scored, its process share and tokens."""
    steps_by_turn: dict[int, list[dict[str, Any]]] = {}
    for s in prm.steps:
        steps_by_turn.setdefault(s.turn, []).append(
            {
                "tool": s.tool,
                "score": s.score,
                "hits": [{"rule": h.rule, "weight": h.weight, "detail": h.detail} for h in s.hits],
            }
        )
    turns = []
    for k, t in enumerate(traj["turns"]):
        turns.append(
            {
                "index": k,
                "content": t.get("content") or "",
                "to_user": bool(t.get("to_user")),
                "tool_calls": [
                    {
                        "name": c["name"],
                        "arguments": c.get("raw_arguments"),
                        "is_error": bool(c.get("is_error")),
                        "known_tool": bool(c.get("known_tool", True)),
                        "parse_error": c.get("parse_error"),
                    }
                    for c in t.get("tool_calls") or []
                ],
                "steps": steps_by_turn.get(k, []),
                "process_share": prm.turn_scores[k] if k < len(prm.turn_scores) else 0.0,
                "tokens": spans[k][1] - spans[k][0],
                # (first, last) weights version of the turn's generation (training traces; None elsewhere)
                "policy_version": t.get("policy_version"),
            }
        )
    return turns


def _add_turn_credit(items: list[dict[str, Any]], tc: TurnCredit) -> None:
    """credit="turn": each trajectory's outcome term and each turn's share, baseline and advantages."""
    for i, item in enumerate(items):
        item["credit"] = {
            "trajectory_reward": float(tc.outcome[i]),
            "trajectory_advantage": float(tc.trajectory_adv[i]),
        }
    for j in range(tc.row.shape[0]):
        i, k = int(tc.row[j]), int(tc.k[j])
        if k < len(items[i]["turns"]):
            items[i]["turns"][k]["credit"] = {
                "share": float(tc.share[j]),
                "baseline": float(tc.baseline[j]),
                "siblings": int(tc.siblings[j]),
                "process_advantage": float(tc.process_adv[j]),
                "advantage": float(tc.trajectory_adv[i] + tc.process_adv[j]),
            }


def _per_turn_summary(a: torch.Tensor, spans: list[tuple[int, int]]) -> list[dict[str, float] | None]:
    """First, last and mean advantage of each turn's tokens (None for a turn without tokens)."""
    per_turn = []
    for s, e in spans:
        seg = a[s:e]
        per_turn.append({"first": float(seg[0]), "last": float(seg[-1]), "mean": float(seg.mean())} if e > s else None)
    return per_turn
