"""Estimators against an independent, loop-by-loop reference implementation written from method.md b, plus edge
cases (empty masks, single tokens, singleton groups, huge L)."""

from __future__ import annotations

import math

import pytest
import torch

from longhaul.algos.estimators import compute_advantages, compute_turn_returns, discount_weights, turn_index


def ref_advantages(r, m, index, advantage, alpha, unit, p, seed_compat, credit, norm, eps=1e-6):
    """Straightforward per-row, per-token loops in Python floats."""
    bs, T = len(r), len(r[0])
    s = [sum(row) for row in r]
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    mean, std = [0.0] * bs, [1.0] * bs
    for rows in groups.values():
        if len(rows) > 1:
            mu = sum(s[i] for i in rows) / len(rows)
            sd = math.sqrt(sum((s[i] - mu) ** 2 for i in rows) / (len(rows) - 1))
            for i in rows:
                mean[i], std[i] = mu, sd
    out = [[0.0] * T for _ in range(bs)]
    for i in range(bs):
        valid = [t for t in range(T) if m[i][t]]
        L = len(valid)
        if L == 0:
            continue
        # turns: runs of 1s
        turn_of, starts, k = {}, [], -1
        for t in range(T):
            if m[i][t] and (t == 0 or not m[i][t - 1]):
                k += 1
                starts.append(t)
            if m[i][t]:
                turn_of[t] = k
        K = k + 1
        for t in valid:
            if credit == "turn":
                g = sum(r[i][starts[turn_of[t]]:])
            else:
                g = s[i]
            a = (g - mean[i]) / (std[i] + eps) if norm else g - mean[i]
            out[i][t] = a
        if advantage == "grpo":
            continue
        lata = advantage in ("lata", "lata_turn_discount")
        use_disc = seed_compat or advantage in ("turn_discount", "lata_turn_discount")
        u_unit = "token" if seed_compat else unit
        if use_disc:
            if u_unit == "token":
                raw = {t: alpha ** (L - 1 - t) for t in valid}
            else:
                raw = {t: alpha ** (K - 1 - turn_of[t]) for t in valid}
            z = sum(raw.values())
            for t in valid:
                out[i][t] *= L * raw[t] / z
        if lata:
            for t in valid:
                out[i][t] *= L ** (-p) if seed_compat else L ** (1 - p)
    return out


def random_batch(gen, bs=12, T=40, groups=3):
    r = torch.zeros(bs, T)
    m = torch.zeros(bs, T, dtype=torch.long)
    for i in range(bs):
        t = 0
        while t < T:
            n1 = int(torch.randint(1, 8, (1,), generator=gen))
            m[i, t:t + n1] = 1
            t += n1 + int(torch.randint(1, 6, (1,), generator=gen))
        L = int(torch.randint(1, T + 1, (1,), generator=gen))
        m[i, L:] = 0
        if m[i].sum() == 0:
            m[i, 0] = 1
        nz = m[i].nonzero().flatten()
        r[i, int(nz[-1])] = float(torch.randint(0, 2, (1,), generator=gen))
        # some per-turn process rewards at random valid positions
        for t in nz[torch.randperm(len(nz), generator=gen)[:3]]:
            r[i, int(t)] += float(torch.randn(1, generator=gen)) * 0.05
    index = [f"u{i % groups}" for i in range(bs)]
    return r, m, index


CONFIGS = [
    (adv, unit, sc, credit, norm)
    for adv in ("grpo", "turn_discount", "lata", "lata_turn_discount")
    for unit in ("token", "turn")
    for sc in (False, True)
    for credit in ("trajectory", "turn")
    for norm in (True, False)
    if not (sc and unit == "turn")
]


@pytest.mark.parametrize("adv,unit,seed_compat,credit,norm", CONFIGS)
def test_matches_reference_on_random_inputs(adv, unit, seed_compat, credit, norm):
    gen = torch.Generator().manual_seed(CONFIGS.index((adv, unit, seed_compat, credit, norm)))
    for alpha, p in ((1.05, 0.5), (0.9, 0.3)):
        r, m, index = random_batch(gen)
        got, ret = compute_advantages(
            r, m, index, advantage=adv, alpha=alpha, discount_unit=unit, length_exponent=p,
            seed_compat=seed_compat, credit=credit, norm_by_std=norm,
        )
        want = torch.tensor(ref_advantages(r.tolist(), m.tolist(), index, adv, alpha, unit, p, seed_compat, credit, norm))
        assert got.dtype == torch.float32 and got.shape == r.shape
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
        assert torch.equal(got, ret)
        assert torch.all(got[m == 0] == 0)


def test_weights_mean_one_and_turn_ratio():
    m = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 0]])
    for unit in ("token", "turn"):
        w = discount_weights(m, 1.05, unit)
        assert w.dtype == torch.float64
        assert w[m.bool()].mean().item() == pytest.approx(1.0)
    w = discount_weights(m, 1.05, "turn")
    assert (w[0, 0] / w[0, 5]).item() == pytest.approx(1.05)
    assert (w[0, 5] / w[0, 8]).item() == pytest.approx(1.05)
    tid, n, start = turn_index(m)
    assert tid[0].tolist() == [0, 0, 0, -1, -1, 1, 1, -1, 2, -1, -1, -1] and n.tolist() == [3]
    assert start[0].tolist()[:9] == [0, 0, 0, 0, 0, 5, 5, 0, 8]


def test_seed_token_discount_concentrates_mass_on_first_tokens():
    """method.md b.2: with α=1.05 per token, ~99 % of the weight sits on the first 94 positions."""
    m = torch.ones(1, 2000, dtype=torch.long)
    w = discount_weights(m, 1.05, "token")
    assert (w[0, :94].sum() / w.sum()).item() == pytest.approx(0.99, abs=0.002)
    assert w[0, 0].item() == pytest.approx(2000 * (1 - 1 / 1.05), rel=1e-6)


def test_turn_returns_exclude_earlier_turns():
    r = torch.tensor([[0.0, 0.1, 0.0, 0.0, -0.2, 0.0, 1.0]])
    m = torch.tensor([[1, 1, 0, 1, 1, 0, 1]])
    g = compute_turn_returns(r, m)
    assert g[0].tolist() == pytest.approx([0.9, 0.9, 0.0, 0.8, 0.8, 0.0, 1.0])


def test_turn_credit_first_turn_equals_trajectory_credit():
    gen = torch.Generator().manual_seed(3)
    r, m, index = random_batch(gen)
    a_traj, _ = compute_advantages(r, m, index, credit="trajectory")
    a_turn, _ = compute_advantages(r, m, index, credit="turn")
    first = m.argmax(dim=1)
    rows = torch.arange(len(r))
    torch.testing.assert_close(a_turn[rows, first], a_traj[rows, first])


@pytest.mark.parametrize("adv", ["grpo", "turn_discount", "lata", "lata_turn_discount"])
@pytest.mark.parametrize("seed_compat", [False, True])
@pytest.mark.parametrize("unit", ["token", "turn"])
def test_edge_cases_are_finite(adv, seed_compat, unit):
    kw = dict(advantage=adv, seed_compat=seed_compat, discount_unit=unit)
    # empty mask rows, a single-token row, singleton group
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 0], [1, 0, 0]])
    a, _ = compute_advantages(r, m, ["a", "a", "b", "c"], **kw)
    assert torch.isfinite(a).all()
    assert torch.all(a[1] == 0)
    # all rows empty
    a, _ = compute_advantages(torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.long), ["a", "a"], **kw)
    assert torch.isfinite(a).all() and torch.all(a == 0)
    # empty batch
    a, _ = compute_advantages(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.long), [], **kw)
    assert a.shape == (0, 4)
    # huge L with the valid tokens far right (the original's inf*0 = NaN case), large alpha
    T = 20000
    m = torch.zeros(2, T, dtype=torch.long)
    m[0, T - 3:] = 1
    m[1, :] = 1
    r = torch.zeros(2, T)
    r[0, -1] = 1.0
    a, _ = compute_advantages(r, m, ["g", "g"], alpha=2.0, **{k: v for k, v in kw.items()})
    assert torch.isfinite(a).all()
    assert a[0].abs().sum() > 0


def test_singleton_group_matches_verl_semantics():
    """A group of one keeps its raw score (mean 0, std 1), exactly like veRL's grpo."""
    r = torch.tensor([[0.0, 0.7]])
    m = torch.tensor([[1, 1]])
    a, _ = compute_advantages(r, m, ["solo"])
    assert a[0].tolist() == pytest.approx([0.7 / (1 + 1e-6)] * 2)


def test_unknown_names_rejected():
    r, m = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="valid: grpo, turn_discount, lata, lata_turn_discount"):
        compute_advantages(r, m, None, advantage="lata2")
    with pytest.raises(ValueError, match="valid: token, turn"):
        compute_advantages(r, m, None, advantage="turn_discount", discount_unit="step")


@pytest.mark.parametrize("alpha", [2.0, 0.5, 1.0, 1.3])
@pytest.mark.parametrize("adv,credit", [("turn_discount", "trajectory"), ("lata_turn_discount", "turn")])
def test_token_unit_across_weight_blocks(alpha, adv, credit):
    """Long rows with large |log α| span several float32 weight blocks; values still match the reference."""
    gen = torch.Generator().manual_seed(int(alpha * 10))
    r, m, index = random_batch(gen, bs=6, T=400, groups=2)
    got, _ = compute_advantages(r, m, index, advantage=adv, alpha=alpha, discount_unit="token", credit=credit)
    want = torch.tensor(ref_advantages(r.tolist(), m.tolist(), index, adv, alpha, "token", 0.5, False, credit, True))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want.float(), rtol=2e-5, atol=1e-6)
