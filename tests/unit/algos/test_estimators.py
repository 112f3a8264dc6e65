"""Estimators against an independent, loop-by-loop reference implementation written from method.md b, plus edge
cases (empty masks, single tokens, singleton groups, huge L)."""

from __future__ import annotations

import math

import pytest
import torch

from longhaul.algos.estimators import compute_advantages, compute_turn_credit, discount_weights, turn_index


def runs_of(mask_row):
    """(start, end) of every run of 1s."""
    out, T = [], len(mask_row)
    for t in range(T):
        if mask_row[t] and (t == 0 or not mask_row[t - 1]):
            e = t
            while e + 1 < T and mask_row[e + 1]:
                e += 1
            out.append((t, e))
    return out


def ref_advantages(r, m, index, advantage, alpha, unit, p, seed_compat, credit, norm, eps=1e-6):
    """Straightforward per-row, per-token loops in Python floats, written from the module docstring."""
    bs, T = len(r), len(r[0])
    s = [sum(row) for row in r]
    runs = [runs_of(m[i]) for i in range(bs)]
    q = [[r[i][st] for st, _ in runs[i]] if credit == "turn" else [] for i in range(bs)]
    o = [s[i] - sum(q[i]) for i in range(bs)]
    groups = {}
    for i, g in enumerate(index):
        groups.setdefault(g, []).append(i)
    a, d = [0.0] * bs, [[0.0] * len(runs[i]) for i in range(bs)]
    for rows in groups.values():
        if len(rows) == 1:
            i = rows[0]
            a[i] = o[i] / (1 + eps) if norm else o[i]
            continue
        mu = sum(o[i] for i in rows) / len(rows)
        sd = math.sqrt(sum((o[i] - mu) ** 2 for i in rows) / (len(rows) - 1))
        for i in rows:
            if not norm:
                a[i] = o[i] - mu
            elif sd < 1e-6 and not seed_compat:
                a[i] = 0.0
            else:
                a[i] = (o[i] - mu) / (sd + eps)
        for k in range(max(len(q[i]) for i in rows)):
            members = [j for j in rows if len(runs[j]) > k]
            if len(members) < 2:
                continue
            b = sum(q[j][k] for j in members) / len(members)
            for j in members:
                d[j][k] = (q[j][k] - b) / (max(sd, 1.0) if norm else 1.0)
    out = [[0.0] * T for _ in range(bs)]
    for i in range(bs):
        valid = [t for t in range(T) if m[i][t]]
        L = len(valid)
        if L == 0:
            continue
        turn_of = {t: k for k, (st, e) in enumerate(runs[i]) for t in range(st, e + 1)}
        K = len(runs[i])
        for t in valid:
            out[i][t] = a[i] + d[i][turn_of[t]]
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
            m[i, t : t + n1] = 1
            t += n1 + int(torch.randint(1, 6, (1,), generator=gen))
        L = int(torch.randint(1, T + 1, (1,), generator=gen))
        m[i, L:] = 0
        if m[i].sum() == 0:
            m[i, 0] = 1
        nz = m[i].nonzero().flatten()
        r[i, int(nz[-1])] = float(torch.randint(0, 2, (1,), generator=gen))
        # per-turn process shares on the first token of each turn, and some rewards elsewhere
        starts = [st for st, _ in runs_of(m[i].tolist())]
        for st in starts:
            r[i, st] += float(torch.randn(1, generator=gen)) * 0.05
        for t in nz[torch.randperm(len(nz), generator=gen)[:2]]:
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
    if not (sc and (unit == "turn" or credit == "turn"))
]


@pytest.mark.parametrize("adv,unit,seed_compat,credit,norm", CONFIGS)
def test_matches_reference_on_random_inputs(adv, unit, seed_compat, credit, norm):
    gen = torch.Generator().manual_seed(CONFIGS.index((adv, unit, seed_compat, credit, norm)))
    for alpha, p in ((1.05, 0.5), (0.9, 0.3)):
        r, m, index = random_batch(gen)
        got, ret = compute_advantages(
            r,
            m,
            index,
            advantage=adv,
            alpha=alpha,
            discount_unit=unit,
            length_exponent=p,
            seed_compat=seed_compat,
            credit=credit,
            norm_by_std=norm,
        )
        want = torch.tensor(
            ref_advantages(r.tolist(), m.tolist(), index, adv, alpha, unit, p, seed_compat, credit, norm)
        )
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
    m[0, T - 3 :] = 1
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


def layout(outcome, shares, mask):
    """A reward row in the agent loop's turn layout (rewards.combine.build_token_rewards)."""
    from longhaul.rewards.combine import RewardBreakdown, build_token_rewards

    rb = RewardBreakdown(outcome + sum(shares), outcome, sum(shares), 1.0, tuple(shares))
    return build_token_rewards(rb, mask, "turn")


def batch(rows, masks):
    T = max(len(mk) for mk in masks)
    r = torch.zeros(len(rows), T)
    m = torch.zeros(len(rows), T, dtype=torch.long)
    for i, (row, mk) in enumerate(zip(rows, masks, strict=True)):
        r[i, : len(row)] = torch.tensor(row)
        m[i, : len(mk)] = torch.tensor(mk)
    return r, m


def test_issue_21_tied_totals_with_different_turn_rewards():
    """The reported case: equal totals (outcome 0 for both), per-turn shares (+0.03, −0.03) vs (−0.03, +0.03).
    The old return-to-go rule divided ±0.03 by std + 1e-6 ≈ 1e-6 (veRL logged −47,816)."""
    mask = [1, 1, 1, 0, 0, 1, 1, 1]
    r, m = batch([layout(0.0, (0.03, -0.03), mask), layout(0.0, (-0.03, 0.03), mask)], [mask, mask])
    assert r.sum(dim=1).tolist() == [0.0, 0.0]
    for adv in ("grpo", "turn_discount", "lata", "lata_turn_discount"):
        for unit in ("token", "turn"):
            a, _ = compute_advantages(r, m, ["g", "g"], advantage=adv, discount_unit=unit, credit="turn")
            assert torch.isfinite(a).all()
            assert a.abs().max().item() < 1.0, (adv, unit, a)
    a, _ = compute_advantages(r, m, ["g", "g"], credit="turn")
    assert a.abs().max().item() <= 0.06
    torch.testing.assert_close(a[0, :3], torch.full((3,), 0.03))
    torch.testing.assert_close(a[0, 5:], torch.full((3,), -0.03))
    torch.testing.assert_close(a[1], -a[0])
    tc = compute_turn_credit(r, m, ["g", "g"])
    assert tc.trajectory_adv.tolist() == [0.0, 0.0] and tc.baseline.abs().max().item() < 1e-9
    # Trajectory credit sees two equal totals: a tie, zero advantage (not float noise / ε).
    a, _ = compute_advantages(r, m, ["g", "g"], credit="trajectory")
    assert torch.all(a == 0)


def test_turn_credit_worked_example():
    """Group of three: outcomes (1, 0, 0); shares per turn; the last trajectory has only two turns."""
    m3, m2 = [1, 1, 0, 1, 0, 1, 1], [1, 0, 1, 1]
    rows = [layout(1.0, (0.02, 0.01, -0.03), m3), layout(0.0, (0.04, -0.02, 0.0), m3), layout(0.0, (0.0, 0.04), m2)]
    r, m = batch(rows, [m3, m3, m2])
    tc = compute_turn_credit(r, m, ["g"] * 3)
    sd = math.sqrt(((1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # 0.577: below one reward unit, so d is not divided
    assert tc.outcome.tolist() == pytest.approx([1.0, 0.0, 0.0], abs=1e-7)
    assert tc.trajectory_adv.tolist() == pytest.approx(
        [(2 / 3) / (sd + 1e-6), -(1 / 3) / (sd + 1e-6), -(1 / 3) / (sd + 1e-6)]
    )
    assert tc.siblings.tolist() == [3, 3, 2, 3, 3, 2, 3, 3]
    b0, b1, b2 = 0.06 / 3, 0.03 / 3, -0.03 / 2
    assert tc.baseline.tolist() == pytest.approx([b0, b1, b2, b0, b1, b2, b0, b1], abs=1e-7)
    q = [0.02, 0.01, -0.03, 0.04, -0.02, 0.0, 0.0, 0.04]
    assert tc.process_adv.tolist() == pytest.approx(
        [x - b for x, b in zip(q, tc.baseline.tolist(), strict=True)], abs=1e-7
    )
    a, _ = compute_advantages(r, m, ["g"] * 3, credit="turn")
    assert a[2, 2].item() == pytest.approx(tc.trajectory_adv[2].item() + 0.04 - b1, abs=1e-6)


def test_turn_credit_ignores_position_and_length():
    """A share every rollout earns at its turn k gives d = 0 whatever k is and however long the turns are; late
    turns are not penalised for being late (the old return-to-go rule gave turn k a lower score than turn 0)."""
    masks = [[1] * 5 + [0] + [1] * 2 + [0] + [1], [1] + [0] * 3 + [1] * 9 + [0] + [1] * 2]
    rows = [layout(1.0, (0.05, 0.05, 0.05), masks[0]), layout(0.0, (0.05, 0.05, 0.05), masks[1])]
    r, m = batch(rows, masks)
    tc = compute_turn_credit(r, m, ["g", "g"])
    assert tc.process_adv.abs().max().item() < 1e-7
    a, _ = compute_advantages(r, m, ["g", "g"], credit="turn")
    for i in range(2):
        vals = a[i][m[i].bool()]
        assert torch.allclose(vals, vals[0].expand_as(vals))


def test_seed_compat_refuses_turn_credit():
    r, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="no per-turn credit"):
        compute_advantages(r, m, ["a", "a"], advantage="lata", seed_compat=True, credit="turn")


def test_near_tie_is_not_amplified_but_seed_compat_keeps_the_original():
    """Totals equal up to float noise (1e-9): longhaul gives 0; seed_compat reproduces (s − mean)/(std + ε)."""
    r = torch.tensor([[0.0, 0.5], [0.0, 0.5 + 1e-9]], dtype=torch.float64)
    m = torch.ones(2, 2, dtype=torch.long)
    a, _ = compute_advantages(r, m, ["g", "g"])
    assert torch.all(a == 0)
    a, _ = compute_advantages(r, m, ["g", "g"], seed_compat=True)
    std = 1e-9 / math.sqrt(2)
    assert a[1, 0].item() == pytest.approx(0.5e-9 / (std + 1e-6), rel=1e-4)
