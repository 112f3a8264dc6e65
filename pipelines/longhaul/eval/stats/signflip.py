"""The exact paired sign-flip test over tasks (pure, deterministic: no random draws).

Under H0 "the arms do not differ", swapping the arms' labels on a task turns its difference d_t into −d_t, and
when whatever differs between runs differs task by task (sampling noise, a seed's luck on one task) every one of
the 2^T sign patterns is equally likely. The p-value is the share of patterns whose |Σ ±d_t| reaches the
observed |Σ d_t| — ties counted as reaching it, so the test never rejects more often than α:

    p = #{ε ∈ {±1}^T : |Σ ε_t d_t| ≥ |Σ d_t|} / 2^T

It is computed exactly, not sampled: the d_t of pass^k (or pass@k) are rationals with one common denominator
(C(n_A,k)·C(n_B,k)·S_A·S_B), so the Σ ε_t d_t live on an integer lattice and their distribution is built by T
two-point convolutions (O(T · Σ|m_t|)). Above `EXACT_LIMIT` lattice cells × tasks (hundreds of tasks with many
seeds and samples) the normal approximation of the same distribution is used; the table says neither, because at
that size they agree to ~1e-3. Its smallest possible value is 2/2^T: with 5 tasks or fewer no difference reaches
p < 0.05.

What it cannot see: a shift of a whole training run is shared by all tasks of one seed, so a per-task swap does not
reproduce it (`longhaul.eval.stats.arms` adds the seed component).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erfc

from longhaul.eval.stats.outcomes import Outcomes, cell_table, common_tasks, task_differences

#: Largest T × (lattice width) computed exactly (≈ 0.1 s); above it, the normal approximation.
EXACT_LIMIT = 50_000_000


def difference_lattice(a: Outcomes, b: Outcomes, k: int = 1, kind: str = "pass_hat") -> tuple[np.ndarray, int]:
    """The per-task differences d_t (B − A, seed means, common tasks) as integers m_t and their denominator L:
    d_t = m_t / L exactly. None of the floating-point rounding of d_t reaches the test. ValueError when L · n would
    not fit 53 bits (pass^k with k near n/2 of dozens of samples)."""
    a, b = common_tasks(a, b)
    scale = len(a.seeds) * len(b.seeds) * math.comb(a.samples, k) * math.comb(b.samples, k)
    if scale * max(len(a.seeds), len(b.seeds)) >= 2**53:
        raise ValueError(f"k={k}: the differences' common denominator {scale} is too large for an exact lattice")
    parts = []
    for o in (a, b):
        c = math.comb(o.samples, k)
        ints = np.rint(cell_table(o.samples, k, kind) * c).astype(np.int64)
        parts.append((ints[o.data.sum(axis=2)].sum(axis=0), c, len(o.seeds)))
    (sum_a, ca, sa), (sum_b, cb, sb) = parts
    m = sa * ca * sum_b - sb * cb * sum_a
    return m.astype(np.int64), sa * sb * ca * cb


def sign_flip_p_value(m: np.ndarray) -> float:
    """Exact two-sided sign-flip p-value of Σ m_t = 0 for integer task differences m_t (module docstring); 1.0 when
    the sum is 0."""
    return signed_sum_tail(m, abs(int(np.asarray(m, dtype=np.int64).sum())))


def permutation_p_value(a: Outcomes, b: Outcomes, k: int = 1, kind: str = "pass_hat") -> float:
    """The exact paired sign-flip p-value of rate(B) = rate(A) on the tasks both arms ran (module docstring)."""
    try:
        m, _ = difference_lattice(a, b, k, kind)
    except ValueError:  # a lattice too fine for 53 bits: the normal approximation of the same distribution
        d = task_differences(a, b, k, kind)
        spread = math.sqrt(float((d**2).sum()))
        return 1.0 if spread == 0 else float(erfc(abs(float(d.sum())) / spread / math.sqrt(2.0)))
    return sign_flip_p_value(m)


def _distribution(values: np.ndarray) -> np.ndarray:
    """P(Σ ε_t x_t = v) for v = −Σx … Σx, x_t ≥ 0 integers, ε_t independent fair signs."""
    dist = np.ones(1)
    for x in values[values > 0]:
        x = int(x)
        grown = np.zeros(dist.size + 2 * x)
        grown[: dist.size] += dist
        grown[2 * x :] += dist
        dist = grown * 0.5
    return dist


def signed_sum_tail(m: np.ndarray, observed: int) -> float:
    """P(|Σ ε_t m_t| ≥ observed) over fair signs ε_t, for integers m_t (exact below `EXACT_LIMIT`)."""
    x = np.abs(np.asarray(m, dtype=np.int64))
    x = x[x > 0]
    if observed <= 0 or x.size == 0:
        return 1.0
    g = int(np.gcd.reduce(x))
    x, observed = x // g, math.ceil(observed / g)
    total = int(x.sum())
    if observed > total:
        return 0.0
    if x.size * (2 * total + 1) > EXACT_LIMIT:
        # Σ ε_t x_t moves in steps of 2: the continuity correction is half a step.
        return float(erfc((observed - 1) / math.sqrt(2.0 * float((x.astype(np.float64) ** 2).sum()))))
    dist = _distribution(x)
    # index i ↔ value i − total; |value| ≥ observed ↔ i ≤ total − observed or i ≥ total + observed
    return float(min(1.0, dist[: total - observed + 1].sum() + dist[total + observed :].sum()))
