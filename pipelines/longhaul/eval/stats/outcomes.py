"""One arm's binary outcomes over seeds × tasks × samples, the per-cell pass^k / pass@k values every statistic starts
from, the arm's rate and its flip rates (pure).

The cell value v[s, t] is pass^k (or pass@k) of the n samples of task t under seed s, the unbiased estimator of
`longhaul.eval.metrics` (C(c,k)/C(n,k), 1 − C(n−c,k)/C(n,k)).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from longhaul.eval.metrics import pass_at_k, pass_hat_k

KINDS = ("pass_hat", "pass_at")


def _task_sort_key(tid: str) -> tuple[int, str]:
    # The order of `metrics.build_task_counts`, so sums run in the same order and rates agree to the bit.
    return (int(tid), tid) if tid.isdigit() else (1 << 30, tid)


@dataclass(frozen=True, eq=False)
class Outcomes:
    """One arm's binary outcomes: `data[s, t, j]` is sample j of task `tasks[t]` under seed `seeds[s]`.

    A rectangular design — every seed ran every task with the same number of samples — is required: the
    macro mean over tasks and the seed resampling assume it. Build from records with `from_records`.
    """

    tasks: tuple[str, ...]
    seeds: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        data = np.asarray(self.data)
        if data.dtype != np.bool_:
            raise ValueError(f"Outcomes.data must be a bool array (got dtype {data.dtype})")
        if data.ndim != 3:
            raise ValueError(f"Outcomes.data must have shape (seeds, tasks, samples) (got shape {data.shape})")
        if data.shape[:2] != (len(self.seeds), len(self.tasks)):
            raise ValueError(
                f"Outcomes.data has shape {data.shape} but there are {len(self.seeds)} seeds and "
                f"{len(self.tasks)} tasks"
            )
        if 0 in data.shape:
            raise ValueError(f"Outcomes need at least one seed, task and sample (got shape {data.shape})")
        if len(set(self.tasks)) != len(self.tasks) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("Outcomes.tasks and Outcomes.seeds must not repeat")
        data = data.copy()
        data.setflags(write=False)
        object.__setattr__(self, "data", data)

    @property
    def samples(self) -> int:
        """Samples (trials) per task and seed."""
        return int(self.data.shape[2])

    @classmethod
    def from_array(cls, data: Any) -> Outcomes:
        """From a (seeds, tasks, samples) array; tasks are named "0", "1", …, seeds 0, 1, …"""
        arr = np.asarray(data, dtype=bool)
        if arr.ndim != 3:
            raise ValueError(f"expected a (seeds, tasks, samples) array (got shape {arr.shape})")
        return cls(tuple(str(t) for t in range(arr.shape[1])), tuple(range(arr.shape[0])), arr)

    @classmethod
    def from_records(cls, records: Iterable[tuple[int, str, int, bool]]) -> Outcomes:
        """From `(seed, task_id, trial, success)` tuples, in any order.

        Within a (seed, task) cell the samples are ordered by trial number. Raises ValueError for a repeated
        (seed, task, trial), for a task that some seed lacks, and for cells with different sample counts.
        """
        cells: dict[tuple[int, str], dict[int, bool]] = {}
        for seed, task, trial, success in records:
            cell = cells.setdefault((int(seed), str(task)), {})
            if int(trial) in cell:
                raise ValueError(
                    f"duplicate record: seed {seed} task {str(task)!r} trial {trial} appears twice "
                    "(a result was written twice; keep one)"
                )
            cell[int(trial)] = bool(success)
        if not cells:
            raise ValueError("no records")
        seeds = sorted({s for s, _ in cells})
        tasks = sorted({t for _, t in cells}, key=_task_sort_key)
        for s in seeds:
            missing = [t for t in tasks if (s, t) not in cells]
            if missing:
                shown = ", ".join(repr(t) for t in missing[:10]) + (" …" if len(missing) > 10 else "")
                raise ValueError(
                    f"ragged design: seed {s} has no records for {len(missing)} task(s) that other "
                    f"seeds ran: {shown}; evaluate every seed on the same tasks or drop those tasks"
                )
        sizes: dict[int, int] = {}
        for cell in cells.values():
            sizes[len(cell)] = sizes.get(len(cell), 0) + 1
        n = max(sizes, key=lambda m: (sizes[m], m))
        for (s, t), cell in sorted(cells.items(), key=lambda kv: (kv[0][0], _task_sort_key(kv[0][1]))):
            if len(cell) != n:
                raise ValueError(
                    f"ragged design: seed {s} task {t!r} has {len(cell)} samples (trials "
                    f"{sorted(cell)[:20]}), the other cells have {n}; every (seed, task) needs the "
                    "same number of samples"
                )
        data = np.array([[[cells[(s, t)][j] for j in sorted(cells[(s, t)])] for t in tasks] for s in seeds], dtype=bool)
        return cls(tuple(tasks), tuple(seeds), data)

    def restrict(self, tasks: Iterable[str]) -> Outcomes:
        """The same arm on a subset of its tasks (in the order given)."""
        index = {t: i for i, t in enumerate(self.tasks)}
        keep = list(tasks)
        unknown = [t for t in keep if t not in index]
        if unknown:
            raise ValueError(f"tasks not in this arm: {unknown[:10]}")
        return Outcomes(tuple(keep), self.seeds, self.data[:, [index[t] for t in keep], :])


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is unknown; valid: {', '.join(KINDS)}")


def cell_table(n: int, k: int = 1, kind: str = "pass_hat") -> np.ndarray:
    """The cell value for c = 0 … n successes of n samples: pass^k (C(c,k)/C(n,k)) or pass@k, from
    `metrics.pass_hat_k` / `pass_at_k`."""
    _check_kind(kind)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} needs 1 ≤ k ≤ n samples per task (n={n}); run more samples or drop k")
    fn = pass_hat_k if kind == "pass_hat" else pass_at_k
    return np.array([fn(c, n, k) for c in range(n + 1)], dtype=np.float64)


def cell_values(o: Outcomes, k: int = 1, kind: str = "pass_hat") -> np.ndarray:
    """(seeds, tasks) array of per-cell pass^k / pass@k, computed with `metrics.pass_hat_k` / `pass_at_k`."""
    return cell_table(o.samples, k, kind)[o.data.sum(axis=2)]


def rate(o: Outcomes, k: int = 1, kind: str = "pass_hat") -> float:
    """Mean over seeds of the macro mean over tasks of the cell's unbiased pass^k (C(c,k)/C(n,k)) or pass@k
    (1 − C(n−c,k)/C(n,k)). With one seed it equals `metrics.compute_rate` on the same records, to the bit."""
    v = cell_values(o, k, kind)
    per_seed = [sum(float(x) for x in row) / len(row) for row in v]
    return sum(per_seed) / len(per_seed)


@dataclass(frozen=True)
class TwoWay:
    """A (seeds, tasks) table of cell values split as v[s, t] = g + α_s + β_t + γ_st (grand mean, seed and task
    margins, residual), with the mean squares of the seed margins (MS_α = Σα²/(S − 1)) and of the residuals
    (MS_γ = Σγ²/((S − 1)(T − 1))). A seed margin α_s carries the seed's whole-run shift plus the average of its T
    residuals, so the method-of-moments whole-seed variance is σ̂² = max(0, MS_α − MS_γ / T) (`seed_variance`).
    With one seed both mean squares are 0 with 0 degrees of freedom; with one task MS_γ is."""

    g: float
    alpha: np.ndarray
    beta: np.ndarray
    ms_seed: float
    df_seed: int
    ms_resid: float
    df_resid: int

    @classmethod
    def of(cls, v: np.ndarray) -> TwoWay:
        """The decomposition of one (seeds, tasks) table."""
        s, t = v.shape
        g = float(v.mean())
        alpha, beta = v.mean(axis=1) - g, v.mean(axis=0) - g
        df_seed, df_resid = s - 1, (s - 1) * (t - 1)
        resid = v - g - alpha[:, None] - beta[None, :]
        ms_seed = float((alpha**2).sum()) / df_seed if df_seed else 0.0
        ms_resid = float((resid**2).sum()) / df_resid if df_resid else 0.0
        return cls(g, alpha, beta, ms_seed, df_seed, ms_resid, df_resid)

    @property
    def seed_variance(self) -> float:
        """σ̂², the method-of-moments variance of a whole seed's shift (0 with one seed)."""
        return max(0.0, self.ms_seed - self.ms_resid / self.beta.size) if self.df_seed else 0.0


def common_tasks(a: Outcomes, b: Outcomes) -> tuple[Outcomes, Outcomes]:
    """Both arms restricted to the tasks both ran (in A's order); ValueError when they share none."""
    in_b = set(b.tasks)
    common = [t for t in a.tasks if t in in_b]
    if not common:
        raise ValueError(
            f"the two arms have no task in common (A: {len(a.tasks)} tasks, e.g. {list(a.tasks[:5])}; "
            f"B: {len(b.tasks)} tasks, e.g. {list(b.tasks[:5])}); compare arms evaluated on the same "
            "tasks"
        )
    return a.restrict(common), b.restrict(common)


def task_differences(a: Outcomes, b: Outcomes, k: int = 1, kind: str = "pass_hat") -> np.ndarray:
    """d_t = mean over B's seeds of vB[s, t] − mean over A's seeds of vA[s, t], on the common tasks."""
    a, b = common_tasks(a, b)
    return cell_values(b, k, kind).mean(axis=0) - cell_values(a, k, kind).mean(axis=0)


# ---------------------------------------------------------------------------------------------------------
# Flip rates


def flip_rate(o: Outcomes) -> float | None:
    """Between-seed flip rate: the probability that one sample of a task under one seed and one sample of the
    same task under another seed disagree, averaged over tasks and seed pairs (all n × n sample pairings of
    the two seeds are used: the same expectation as pairing sample j with sample j, with less noise; for
    n = 1 they coincide). None with one seed. Under independent outcomes with per-cell success probability
    p it estimates E[p_s(1 − p_s') + p_s'(1 − p_s)]."""
    if len(o.seeds) < 2:
        return None
    n = o.samples
    c = o.data.sum(axis=2).astype(np.float64)  # (S, T)
    dis = c[:, None, :] * (n - c[None, :, :]) + c[None, :, :] * (n - c[:, None, :])  # (S, S, T), symmetric
    iu = np.triu_indices(len(o.seeds), k=1)
    return float(dis[iu].mean() / (n * n))


def within_seed_flip_rate(o: Outcomes) -> float | None:
    """Within-seed flip rate: the probability that two different samples of one task under one seed
    disagree, 2c(n − c)/(n(n − 1)) per cell (unbiased for 2p(1 − p)), averaged over cells. None when n = 1."""
    n = o.samples
    if n < 2:
        return None
    c = o.data.sum(axis=2).astype(np.float64)
    return float((2 * c * (n - c) / (n * (n - 1))).mean())
