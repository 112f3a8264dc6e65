"""Checkpoint selection (pure): the best evaluated checkpoint on `spec.evaluation.select_on`, never on test.

The rule: highest pass^1 on the `select_on` subset; ties → the earliest step. Step 0 (the initial policy) is a
candidate like any other. The subset must hold no test task: the spec refuses `select_on: test`, and every
split longhaul builds also defines `unseen` as the test tasks (`longhaul.envs.airline.splits`), so `unseen` is
refused here too, as is any subset that shares a task with the test split (`check_select_on`). Nothing falls
back to the overall pass^1, which includes the test tasks.

The eval stage records the result on the training run (`longhaul.tracking.runs.log_selection`); the ablation
table marks the same checkpoint (`longhaul.analysis.ablation.select_point`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longhaul.analysis import tags as T

#: Subset names that are the test tasks in every split longhaul builds.
TEST_SUBSETS = frozenset({"test", "unseen"})
NO_CANDIDATE = "no evaluated checkpoint has a pass^1 on that subset"


@dataclass(frozen=True)
class Selection:
    """The selected checkpoint: its step, its pass^1 on `select_on`, and how many checkpoints were compared."""

    select_on: str
    step: int
    pass_hat_1: float
    candidates: int


def check_select_on(select_on: str, subsets: Mapping[str, Sequence[str]], test_ids: Sequence[str]) -> str | None:
    """Why `select_on` cannot select checkpoints in this split (None = it can)."""
    if select_on in TEST_SUBSETS:
        return (
            f"select_on '{select_on}' is the test split (longhaul's splits define 'unseen' as the test tasks); "
            "selecting on it biases the reported numbers — use train, covered_seen or uncovered_seen"
        )
    if select_on not in subsets:
        return f"select_on '{select_on}' is not a subset of this split (subsets: {', '.join(subsets) or 'none'})"
    leaked = sorted(set(map(str, subsets[select_on])) & set(map(str, test_ids)))
    if leaked:
        return f"select_on '{select_on}' contains test tasks {leaked[:10]}; select on a subset without test tasks"
    return None


def select_checkpoint(pass1_by_step: Mapping[int, float | None], select_on: str) -> Selection | None:
    """The step with the highest pass^1 (ties → earliest step); steps without a value are not candidates.
    None when no step has a value. Raises ValueError for a test subset."""
    if select_on in TEST_SUBSETS:
        raise ValueError(f"checkpoints are never selected on '{select_on}' (test tasks)")
    scored = [(float(v), step) for step, v in pass1_by_step.items() if v is not None]
    if not scored:
        return None
    value, step = max(scored, key=lambda vs: (vs[0], -vs[1]))
    return Selection(select_on, int(step), value, len(scored))


def compute_subset_pass_hat_1(summary: Mapping[str, Any], subset: str) -> float | None:
    """pass^1 of `subset` in an evaluation summary (`longhaul.eval.metrics.compute_summary`): the logged value,
    else (k without 1) the mean over the subset's tasks of c/n from `per_task`; None when the subset is absent."""
    block = (summary.get("subsets") or {}).get(subset)
    if block is None:
        return None
    logged = (block.get("pass_hat_k") or {}).get("1")
    if logged is not None:
        return float(logged)
    rates = [t["c"] / t["n"] for t in summary.get("per_task") or () if subset in t.get("subsets", ()) and t["n"]]
    return sum(rates) / len(rates) if rates else None


def build_selection(summaries: Mapping[int, Mapping[str, Any]], select_on: str) -> Selection | None:
    """`select_checkpoint` over evaluation summaries by checkpoint step."""
    return select_checkpoint(
        {step: compute_subset_pass_hat_1(s, select_on) for step, s in summaries.items()}, select_on
    )


def build_selection_tags(select_on: str, selection: Selection | None, reason: str | None = None) -> dict[str, str]:
    """Tags for the training run: the rule (`longhaul.select_on`) and the selected step and its pass^1, or a
    note saying why nothing was selected."""
    tags = {T.SELECT_ON: select_on}
    if selection is None:
        tags[T.SELECTION_NOTE] = reason or NO_CANDIDATE
    else:
        tags[T.SELECTED_STEP] = str(selection.step)
        tags[T.SELECTED_PASS_HAT_1] = repr(selection.pass_hat_1)
    return tags


def build_selection_message(selection: Selection | None, select_on: str, reason: str | None = None) -> str:
    """The eval stage's console line about the selection."""
    if selection is None:
        return f"no checkpoint selected on {select_on}: {reason or NO_CANDIDATE}"
    return (
        f"selected step {selection.step} on {select_on}: pass^1 {selection.pass_hat_1:.3f} "
        f"(best of {selection.candidates} checkpoint{'s' if selection.candidates != 1 else ''}; "
        "ties → earliest step; never on test)"
    )
