"""pass^k, pass@k, subsets, generalisation pass^1 and bootstrap confidence intervals. Pure: no I/O, no clock,
randomness only through an explicit `random.Random`.

Per task: n trials at identical sampling settings, c successes.
    pass^k = mean over tasks of C(c, k) / C(n, k)          (all k sampled trials succeed; τ-bench)
    pass@k = mean over tasks of 1 − C(n − c, k) / C(n, k)  (at least one of k succeeds)
Both need n ≥ k for every task. pass^1 = pass@1 = macro mean of c / n.

Unscored trials (`scored: false`: an endpoint failed past its retries, `longhaul.eval.evaluate`) have no outcome.
A task with one is left out of every rate — counting it as a failure would charge the agent for the harness, and
rating it on its other trials would change its n — and the summary lists it (`incomplete_tasks`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any

#: Weights of the seed project's "generalisation pass^1": (uncovered_seen·24 + unseen·10) / 34.
GENERALISATION_WEIGHTS = {"uncovered_seen": 24, "unseen": 10}
#: k values of a summary when none are given: these, up to the smallest n of a task.
DEFAULT_KS = (1, 2, 4, 8)


def pass_hat_k(c: int, n: int, k: int) -> float:
    """Probability that k trials drawn without replacement from n (c successes) all succeed."""
    _check(c, n, k)
    return comb(c, k) / comb(n, k)


def pass_at_k(c: int, n: int, k: int) -> float:
    """Probability that at least one of k trials drawn without replacement from n (c successes) succeeds."""
    _check(c, n, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def _check(c: int, n: int, k: int) -> None:
    if not (0 <= c <= n):
        raise ValueError(f"successes c={c} must be within 0..n (n={n})")
    if not (1 <= k <= n):
        raise ValueError(f"k={k} needs 1 ≤ k ≤ n trials per task (n={n}); run more samples_per_task or drop k")


@dataclass(frozen=True)
class TaskCount:
    """c successes out of n trials for one task, plus its subset labels."""

    task_id: str
    n: int
    c: int
    subsets: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrialRecord:
    """One line of a results JSONL file (the fields the metrics need)."""

    task_id: str
    trial: int
    success: bool
    subsets: tuple[str, ...] = ()
    aborted: bool = False
    termination: str = ""
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    num_unknown_tool_calls: int = 0
    num_turns: int = 0
    seed: int | None = None
    scored: bool = True

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrialRecord:
        """From a JSON record; needs `task_id`, `trial`, `success` and `subset` or `subsets`. Types are strict (a
        record is counted, so a wrong type must never be coerced): ValueError names the field, KeyError a missing
        one."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a record is a JSON object, not {type(d).__name__}")
        for key in ("task_id", "trial", "success"):
            if key not in d:
                raise KeyError(f"record is missing {key!r} (need task_id, trial, success, subset): {dict(d)}")
        task_id = d["task_id"]
        if isinstance(task_id, bool) or not isinstance(task_id, str | int):
            raise ValueError(f"field 'task_id' must be a string or an integer (got {task_id!r})")
        subsets = d.get("subsets")
        if subsets is None:
            subsets = [d["subset"]] if d.get("subset") is not None else []
        if not isinstance(subsets, list) or not all(isinstance(s, str) for s in subsets):
            raise ValueError(f"field 'subset(s)' must be a string or a list of strings (got {subsets!r})")
        seed = d.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"field 'seed' must be an integer (got {seed!r})")
        termination = d.get("termination", "")
        if not isinstance(termination, str):
            raise ValueError(f"field 'termination' must be a string (got {termination!r})")
        return cls(
            task_id=str(task_id),
            trial=_count(d, "trial"),
            success=_flag(d, "success"),
            subsets=tuple(subsets),
            aborted=_flag(d, "aborted", False),
            termination=termination,
            num_tool_calls=_count(d, "num_tool_calls", 0),
            num_tool_errors=_count(d, "num_tool_errors", 0),
            num_unknown_tool_calls=_count(d, "num_unknown_tool_calls", 0),
            num_turns=_count(d, "num_turns", 0),
            seed=seed,
            scored=_flag(d, "scored", True),
        )


def _flag(d: Mapping[str, Any], key: str, default: bool | None = None) -> bool:
    """A JSON true/false field (never a coerced string or number: bool("false") is True)."""
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"field {key!r} must be true or false (got {value!r})")
    return value


def _count(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """A JSON integer field ≥ 0 (not a boolean, a float or a string)."""
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"field {key!r} must be an integer ≥ 0 (got {value!r})")
    return value


def incomplete_tasks(records: Iterable[TrialRecord]) -> set[str]:
    """Tasks with at least one unscored trial (module docstring): left out of every rate."""
    return {r.task_id for r in records if not r.scored}


def complete_records(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The records of tasks whose every trial was scored."""
    drop = incomplete_tasks(records)
    return [r for r in records if r.task_id not in drop]


def build_task_counts(records: Sequence[TrialRecord]) -> list[TaskCount]:
    """Group trial records by task (duplicate (task, trial) pairs are an error: a record was written twice).
    Tasks with an unscored trial are left out (module docstring)."""
    seen: set[tuple[str, int]] = set()
    by_task: dict[str, list[TrialRecord]] = {}
    drop = incomplete_tasks(records)
    for r in records:
        key = (r.task_id, r.trial)
        if key in seen:
            raise ValueError(f"duplicate record for task {r.task_id} trial {r.trial}")
        seen.add(key)
        if r.task_id not in drop:
            by_task.setdefault(r.task_id, []).append(r)
    out = []
    for tid in sorted(by_task, key=_task_sort_key):
        rs = by_task[tid]
        subsets = tuple(dict.fromkeys(s for r in rs for s in r.subsets))
        out.append(TaskCount(tid, len(rs), sum(1 for r in rs if r.success), subsets))
    return out


def _task_sort_key(tid: str) -> tuple[int, str]:
    return (int(tid), tid) if tid.isdigit() else (1 << 30, tid)


def compute_rate(counts: Sequence[TaskCount], k: int, kind: str = "pass_hat") -> float:
    """Macro mean over tasks of pass^k (`pass_hat`) or pass@k (`pass_at`)."""
    if not counts:
        raise ValueError("no tasks to average over")
    fn = pass_hat_k if kind == "pass_hat" else pass_at_k
    return sum(fn(t.c, t.n, k) for t in counts) / len(counts)


def bootstrap_ci(
    counts: Sequence[TaskCount], k: int, kind: str, rng: random.Random, samples: int = 1000, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of pass^k / pass@k, resampling tasks with replacement."""
    if not counts:
        raise ValueError("no tasks to resample")
    fn = pass_hat_k if kind == "pass_hat" else pass_at_k
    per_task = [fn(t.c, t.n, k) for t in counts]
    m = len(per_task)
    stats = sorted(sum(per_task[rng.randrange(m)] for _ in range(m)) / m for _ in range(samples))
    alpha = (1.0 - confidence) / 2.0
    lo = stats[min(samples - 1, int(alpha * samples))]
    hi = stats[max(0, min(samples - 1, int((1.0 - alpha) * samples) - 1))]
    return lo, hi


@dataclass(frozen=True)
class RateBlock:
    """Rates of one group of tasks."""

    tasks: int
    trials: int
    successes: int
    pass_hat_k: dict[str, float]
    pass_at_k: dict[str, float]
    ci: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "trials": self.trials,
            "successes": self.successes,
            "c_over_n": f"{self.successes}/{self.trials}",
            "pass_hat_k": self.pass_hat_k,
            "pass_at_k": self.pass_at_k,
            "ci": self.ci,
        }


def compute_block(
    counts: Sequence[TaskCount], ks: Sequence[int], rng: random.Random | None, samples: int, confidence: float
) -> RateBlock:
    hat = {str(k): compute_rate(counts, k, "pass_hat") for k in ks}
    at = {str(k): compute_rate(counts, k, "pass_at") for k in ks}
    ci: dict[str, dict[str, list[float]]] = {}
    if rng is not None and samples > 0:
        ci = {
            "pass_hat_k": {str(k): list(bootstrap_ci(counts, k, "pass_hat", rng, samples, confidence)) for k in ks},
            "pass_at_k": {str(k): list(bootstrap_ci(counts, k, "pass_at", rng, samples, confidence)) for k in ks},
        }
    return RateBlock(len(counts), sum(t.n for t in counts), sum(t.c for t in counts), hat, at, ci)


#: The termination counted for an episode whose record names none.
UNKNOWN_TERMINATION = "unknown"


def count_terminations(reasons: Iterable[str | None]) -> dict[str, int]:
    """How many episodes ended each way, by reason in sorted order; a missing reason counts as
    `UNKNOWN_TERMINATION`. The evaluation summary and the training steps of the learning curve count alike."""
    counts: dict[str, int] = {}
    for reason in reasons:
        key = str(reason or UNKNOWN_TERMINATION)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def compute_summary(
    records: Sequence[TrialRecord],
    ks: Sequence[int],
    *,
    rng: random.Random | None = None,
    bootstrap_samples: int = 1000,
    confidence: float = 0.95,
    null_floor: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Every metric of an evaluation from its trial records (the `longhaul eval summarize --json` document).

    `null_floor` (task id → 1/0 for the do-nothing agent) adds the floor per block, to read pass^k against.
    """
    counts = build_task_counts(records)
    incomplete = sorted(incomplete_tasks(records), key=_task_sort_key)
    if not counts:
        raise ValueError(
            f"no task has all its trials scored ({len(incomplete)} incomplete: an endpoint failed past "
            "its retries; see the records' endpoint_error)"
            if incomplete
            else "no records"
        )
    n_min = min(t.n for t in counts)
    bad_k = [k for k in ks if k > n_min]
    if bad_k:
        short = [t.task_id for t in counts if t.n < max(ks)][:10]
        raise ValueError(
            f"k={bad_k} exceeds the trials of some tasks (min n = {n_min}; e.g. tasks {short}); "
            "evaluate with samples_per_task ≥ max k or drop those k"
        )
    overall = compute_block(counts, ks, rng, bootstrap_samples, confidence)
    subsets: dict[str, Any] = {}
    names = list(dict.fromkeys(s for t in counts for s in t.subsets))
    for name in names:
        sub = [t for t in counts if name in t.subsets]
        subsets[name] = compute_block(sub, ks, rng, bootstrap_samples, confidence).to_dict()
        if null_floor is not None:
            subsets[name]["null_agent_floor"] = _floor(sub, null_floor)
    unscored = sum(1 for r in records if not r.scored)
    records = complete_records(records)
    trials = len(records)
    tool_calls = sum(r.num_tool_calls for r in records)
    tool_errors = sum(r.num_tool_errors for r in records)
    aborted = sum(1 for r in records if r.aborted)
    out: dict[str, Any] = {
        "k": [int(k) for k in ks],
        "tasks": len(counts),
        "trials": trials,
        "successes": overall.successes,
        "c_over_n": f"{overall.successes}/{trials}",
        "pass_hat_k": overall.pass_hat_k,
        "pass_at_k": overall.pass_at_k,
        "ci": overall.ci,
        "confidence": confidence if rng is not None else None,
        "subsets": subsets,
        "generalisation_pass_hat_1": compute_generalisation(counts),
        "tool_calls": tool_calls,
        "tool_errors": tool_errors,
        "tool_error_rate": (tool_errors / tool_calls) if tool_calls else 0.0,
        "unknown_tool_calls": sum(r.num_unknown_tool_calls for r in records),
        "aborted_trials": aborted,
        "abort_rate": aborted / trials,
        "terminations": count_terminations(r.termination for r in records),
        "avg_turns": sum(r.num_turns for r in records) / trials,
        "per_task": [{"task_id": t.task_id, "n": t.n, "c": t.c, "subsets": list(t.subsets)} for t in counts],
        "unscored_trials": unscored,
        "incomplete_tasks": incomplete,
    }
    if null_floor is not None:
        out["null_agent_floor"] = _floor(counts, null_floor)
    return out


def bootstrap_seed(eval_seeds: Sequence[int]) -> int:
    """The seed of an evaluation's bootstrap: its first evaluation seed (`spec.evaluation.seeds`, or `longhaul eval
    --seed`), the same in `longhaul eval` and the launcher's eval stage, so the same records give the same CIs."""
    if not eval_seeds:
        raise ValueError("an evaluation needs at least one seed")
    return int(eval_seeds[0])


def summarize_records(
    records: Iterable[Mapping[str, Any]],
    ks: Sequence[int] | None,
    *,
    bootstrap: int,
    confidence: float,
    seed: int,
    null_floor: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The summary document of an evaluation from its JSON trial records: the one function behind `longhaul eval`,
    `longhaul eval summarize` and the launcher's eval stage.

    `ks` None: `DEFAULT_KS` up to the smallest n. The bootstrap (`bootstrap` resamples, none for 0) draws from
    `random.Random(seed)`; evaluations pass `bootstrap_seed(seeds)`. `null_floor`: as in `compute_summary`.
    """
    recs = [TrialRecord.from_dict(r) for r in records]
    if ks is None:
        n_min = min(t.n for t in build_task_counts(recs))
        ks = [k for k in DEFAULT_KS if k <= n_min]
    rng = random.Random(seed) if bootstrap > 0 else None
    return compute_summary(recs, ks, rng=rng, bootstrap_samples=bootstrap, confidence=confidence, null_floor=null_floor)


def _floor(counts: Sequence[TaskCount], floor: Mapping[str, float]) -> float | None:
    vals = [floor[t.task_id] for t in counts if t.task_id in floor]
    return sum(vals) / len(vals) if vals else None


def compute_generalisation(counts: Sequence[TaskCount]) -> float | None:
    """(pass^1 of uncovered_seen · 24 + pass^1 of unseen · 10) / 34; None unless both subsets have tasks.

    The weights are the seed project's task counts, kept so numbers stay comparable with its reports."""
    parts = {}
    for name in GENERALISATION_WEIGHTS:
        sub = [t for t in counts if name in t.subsets]
        if not sub:
            return None
        parts[name] = compute_rate(sub, 1, "pass_hat")
    total = sum(GENERALISATION_WEIGHTS.values())
    return sum(parts[name] * w for name, w in GENERALISATION_WEIGHTS.items()) / total
