"""Property tests of every estimator × credit × unit (× norm_by_std, seed_compat where it applies): bounded and
finite, zero off the mask, identical trajectories get zero, permutation equivariance, credit=turn with no
process shares equals credit=trajectory, and ties in the outcome never amplify per-turn differences."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longhaul.algos.estimators import ADVANTAGES, CREDITS, compute_advantages, discount_weights
from longhaul.rewards.combine import RewardBreakdown, build_token_rewards

FAST = settings(max_examples=30, deadline=None)
CASES = [(adv, credit) for adv in ADVANTAGES for credit in CREDITS]
EPS = 1e-6

reward = st.one_of(st.just(0.0), st.just(1.0), st.floats(-2.0, 2.0, width=32))
options = st.fixed_dictionaries(
    {
        "discount_unit": st.sampled_from(["token", "turn"]),
        "norm_by_std": st.booleans(),
        "alpha": st.floats(0.5, 2.0),
        "length_exponent": st.floats(0.0, 1.0),
        "seed_compat": st.booleans(),
    }
)


@st.composite
def batches(draw, max_T=14):
    """(rewards (bs, T) float32, mask (bs, T), index): 1–3 groups of 1–4 rows, arbitrary rewards in [−2, 2]."""
    T = draw(st.integers(1, max_T))
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    rows, masks, index = [], [], []
    for g, n in enumerate(sizes):
        for _ in range(n):
            masks.append(draw(st.lists(st.sampled_from([0, 1]), min_size=T, max_size=T)))
            rows.append(draw(st.lists(reward, min_size=T, max_size=T)))
            index.append(f"g{g}")
    return torch.tensor(rows, dtype=torch.float32), torch.tensor(masks), index


def fix(credit, opts):
    """seed_compat is only defined for trajectory credit and the token unit."""
    opts = dict(opts)
    if credit == "turn" or not opts["seed_compat"]:
        opts["seed_compat"] = False
    else:
        opts["discount_unit"] = "token"
    return opts


def run(r, m, index, adv, credit, opts):
    a, ret = compute_advantages(r, m, index, advantage=adv, credit=credit, **opts)
    assert torch.equal(a, ret) and a.shape == r.shape and a.dtype == r.dtype
    return a


def decode(r, m):
    """Independent decoder: per row the run starts, the shares q_k = r[start_k] and the trajectory-level reward."""
    out = []
    for i in range(r.shape[0]):
        mk, row = m[i].tolist(), r[i].double().tolist()
        starts = [t for t in range(len(mk)) if mk[t] and (t == 0 or not mk[t - 1])]
        q = [row[s] for s in starts]
        out.append((starts, q, sum(row) - sum(q)))
    return out


def multipliers(m, adv, opts):
    """The documented per-token multipliers (discount weight × LATA scale), float64."""
    L = m.sum(dim=1, keepdim=True).double().clamp(min=1.0)
    mult = torch.ones(m.shape, dtype=torch.float64)
    seed = opts["seed_compat"]
    if seed and adv != "grpo" or adv in ("turn_discount", "lata_turn_discount"):
        mult = mult * discount_weights(m, opts["alpha"], "token" if seed else opts["discount_unit"])
    if adv in ("lata", "lata_turn_discount"):
        mult = mult * (L.pow(-opts["length_exponent"]) if seed else L.pow(1.0 - opts["length_exponent"]))
    return mult


def bounds(r, m, index, credit, norm, trajectory_term=True):
    """Per-token bound of |a_i + d_{i,k}| before the multipliers (module docstring); without the trajectory
    term: the bound of |d_{i,k}| alone."""
    dec = decode(r, m)
    T = m.shape[1]
    out = torch.zeros(m.shape, dtype=torch.float64)
    for i, (starts, q, o) in enumerate(dec):
        if credit == "trajectory":
            o, q = o + sum(q), [0.0] * len(q)
        members = [j for j, g in enumerate(index) if g == index[i]]
        n = len(members)
        others = [(dec[j][2] + (sum(dec[j][1]) if credit == "trajectory" else 0.0)) for j in members]
        if not trajectory_term:
            b_a = 0.0
        elif n == 1:
            b_a = abs(o)
        elif norm:
            b_a = (n - 1) / math.sqrt(n)
        else:
            b_a = max(abs(o - x) for x in others)
        for k, s in enumerate(starts):
            sib = [dec[j][1][k] for j in members if len(dec[j][1]) > k] if credit == "turn" else []
            b_d = max((abs(q[k] - x) for x in sib), default=0.0)
            e = s
            while e < T and m[i, e]:
                out[i, e] = b_a + b_d
                e += 1
    return out


@pytest.mark.parametrize("adv,credit", CASES)
@FAST
@given(data=batches(), opts=options)
def test_bounded_finite_and_zero_off_mask(adv, credit, data, opts):
    r, m, index = data
    opts = fix(credit, opts)
    a = run(r, m, index, adv, credit, opts).double()
    assert torch.isfinite(a).all()
    assert torch.all(a[m == 0] == 0)
    mult = multipliers(m, adv, opts)
    L = m.sum(dim=1, keepdim=True).double()
    assert torch.all(mult <= L.clamp(min=1.0).pow(2.0) + 1e-9)  # the documented coarse bound L^(2−p) ≤ L²
    bound = bounds(r, m, index, credit, opts["norm_by_std"]) * mult
    assert torch.all(a.abs() <= bound * (1 + 1e-4) + 1e-5), (a, bound)


@pytest.mark.parametrize("adv,credit", CASES)
@FAST
@given(data=batches(), opts=options, n=st.integers(2, 5))
def test_identical_trajectories_get_zero(adv, credit, data, opts, n):
    r, m, _ = data
    opts = fix(credit, opts)
    r, m = r[:1].repeat(n, 1), m[:1].repeat(n, 1)
    a = run(r, m, ["g"] * n, adv, credit, opts)
    if opts["seed_compat"]:  # the original's plain group mean leaves float noise / ε
        assert a.abs().max().item() <= 1e-6 * max(1.0, m.shape[1] ** 2)
    else:
        assert torch.all(a == 0)


@pytest.mark.parametrize("adv,credit", CASES)
@FAST
@given(data=batches(), opts=options, seed=st.integers(0, 2**16))
def test_permuting_rows_permutes_advantages(adv, credit, data, opts, seed):
    r, m, index = data
    opts = fix(credit, opts)
    perm = torch.randperm(r.shape[0], generator=torch.Generator().manual_seed(seed))
    a = run(r, m, index, adv, credit, opts)
    b = run(r[perm], m[perm], [index[int(j)] for j in perm], adv, credit, opts)
    torch.testing.assert_close(b, a[perm], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("adv", ADVANTAGES)
@FAST
@given(data=batches(), opts=options)
def test_turn_credit_without_process_shares_is_trajectory_credit(adv, data, opts):
    r, m, index = data
    opts = fix("turn", opts)
    for i, (starts, _, _) in enumerate(decode(r, m)):
        r[i, starts] = 0.0  # zero process weight: nothing on the first token of any turn
    torch.testing.assert_close(
        run(r, m, index, adv, "turn", opts), run(r, m, index, adv, "trajectory", opts), rtol=0, atol=0
    )


@st.composite
def tied_groups(draw, max_T=14):
    """Rows in the agent loop's turn layout: one group, the same outcome everywhere, arbitrary per-turn shares."""
    outcome = draw(st.sampled_from([0.0, 1.0]))
    n = draw(st.integers(2, 5))
    T = draw(st.integers(2, max_T))
    rows, masks = [], []
    for _ in range(n):
        L = draw(st.integers(2, T))
        mk = draw(st.lists(st.sampled_from([0, 1]), min_size=L, max_size=L).filter(any))
        shares = draw(st.lists(st.floats(-0.5, 0.5, width=32), min_size=1, max_size=4))
        rb = RewardBreakdown(outcome + sum(shares), outcome, sum(shares), 1.0, tuple(shares))
        rows.append(build_token_rewards(rb, mk, "turn") + [0.0] * (T - L))
        masks.append(mk + [0] * (T - L))
    return torch.tensor(rows, dtype=torch.float32), torch.tensor(masks), ["g"] * n


@pytest.mark.parametrize("adv", ADVANTAGES)
@FAST
@given(data=tied_groups(), opts=options)
def test_tied_outcomes_never_amplify_turn_differences(adv, data, opts):
    """All outcomes equal: the advantage of turn k is its share minus the baseline, in reward units (× the
    documented multipliers), however small the spread of the totals."""
    r, m, index = data
    opts = fix("turn", opts)
    dec = decode(r, m)
    outcomes = [o for _, _, o in dec]
    assert max(outcomes) - min(outcomes) < 1e-9  # the layout decodes the tied outcome (up to float rounding)
    a = run(r, m, index, adv, "turn", opts).double()
    bound = bounds(r, m, index, "turn", opts["norm_by_std"], trajectory_term=False) * multipliers(m, adv, opts)
    assert torch.all(a.abs() <= bound * (1 + 1e-4) + 1e-6)
    if adv == "grpo":  # no multipliers: at most the largest difference between two shares of the same turn
        assert a.abs().max().item() <= max(max(q) - min(q) for q in _by_turn(dec)) + 1e-6


def _by_turn(dec):
    k_max = max(len(q) for _, q, _ in dec)
    return [[q[k] for _, q, _ in dec if len(q) > k] for k in range(k_max)]
