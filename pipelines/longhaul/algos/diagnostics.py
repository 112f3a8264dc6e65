"""Group-saturation diagnostics for one training step (method.md a.4).

When every rollout of a task fails (or every one succeeds) the outcome carries no signal; with a process reward
the group's spread then comes only from weight·process and `norm_adv_by_std` blows those small rule differences
up to unit-size advantages. These numbers show how often that happens. Pure: plain Python, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence


def _std(xs: Sequence[float]) -> float:
    """Unbiased std like GRPO's group normalisation; 0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def compute_group_saturation(
    outcomes: Sequence[float],
    index: Sequence[Hashable],
    scores: Sequence[float] | None = None,
    process: Sequence[float] | None = None,
) -> dict[str, float]:
    """Metrics (MLflow keys) for one batch of rollouts grouped by `index` (veRL's uid):

    * `saturation/frac_all_fail`, `saturation/frac_all_success`: fraction of groups whose binary outcomes are
      all 0 / all 1;
    * `saturation/mean_group_std_outcome`, `saturation/mean_group_std_score`: mean within-group std of the
      outcome and of the trained reward (`scores`, default = outcomes);
    * `saturation/frac_process_only_signal`: fraction of groups that are saturated on the outcome yet have a
      non-zero reward spread (the process reward is their whole learning signal);
    * `saturation/mean_group_std_process`, `saturation/process_spread` (max − min over the batch),
      `saturation/process_mean` when `process` is given;
    * `saturation/num_groups`.
    """
    n = len(outcomes)
    if len(index) != n or (scores is not None and len(scores) != n) or (process is not None and len(process) != n):
        raise ValueError("outcomes, index, scores and process must have the same length")
    scores = list(outcomes) if scores is None else list(scores)
    groups: dict[Hashable, list[int]] = {}
    for i, k in enumerate(index):
        groups.setdefault(k, []).append(i)
    g = len(groups)
    out: dict[str, float] = {"saturation/num_groups": float(g)}
    if g == 0:
        return out
    all_fail = all_success = process_only = 0
    std_o = std_s = std_p = 0.0
    for rows in groups.values():
        o = [float(outcomes[i]) for i in rows]
        s = [float(scores[i]) for i in rows]
        fail, success = all(x < 0.5 for x in o), all(x >= 0.5 for x in o)
        all_fail += fail
        all_success += success
        so, ss = _std(o), _std(s)
        std_o += so
        std_s += ss
        if (fail or success) and ss > 0.0:
            process_only += 1
        if process is not None:
            std_p += _std([float(process[i]) for i in rows])
    out.update(
        {
            "saturation/frac_all_fail": all_fail / g,
            "saturation/frac_all_success": all_success / g,
            "saturation/mean_group_std_outcome": std_o / g,
            "saturation/mean_group_std_score": std_s / g,
            "saturation/frac_process_only_signal": process_only / g,
        }
    )
    if process is not None and n:
        out["saturation/mean_group_std_process"] = std_p / g
        out["saturation/process_spread"] = float(max(process) - min(process))
        out["saturation/process_mean"] = float(sum(process) / n)
    return out
