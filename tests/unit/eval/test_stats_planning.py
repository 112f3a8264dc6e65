"""longhaul.eval.stats: power, MDE and the design a target effect needs, for the verdict's rule with training-seed
noise; the design file `longhaul compare` writes and `longhaul power --from-comparison` reads (issue 14 item 4,
issue 29 items 2, 3).

Power at the printed MDE against simulated studies: tests/unit/tracking/test_compare_calibration.py."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from longhaul.eval.stats import (
    ALPHA,
    DEFAULT_BASELINE,
    DEFAULT_FLIP_RATE,
    DEFAULT_SEED_SD,
    POWER,
    Outcomes,
    StudyDesign,
    compare_arms,
    difference_variance,
    flip_rate,
    mde,
    power,
    rate,
    required_design,
    within_seed_flip_rate,
)


def test_defaults_reproduce_the_noise_floor_they_come_from():
    # τ² issue #540: two single runs (1 sample per task) on 50 tasks must differ by ~11 points at the upper end.
    sd = math.sqrt(difference_variance(0.0, 50, 1, 1, DEFAULT_BASELINE, DEFAULT_FLIP_RATE) / 50)
    assert NormalDist().inv_cdf(0.975) * sd == pytest.approx(0.11, abs=0.002)
    assert (ALPHA, POWER, DEFAULT_SEED_SD) == (0.05, 0.8, 0.024)


def test_variance_model_by_hand():
    # V = [(f − f_w) + (f_w + δ(1 − 2b) − δ² − σ²)/N]/S + σ²
    v = difference_variance(0.1, 50, 4, 2, 0.3, 0.3, within_flip_rate=0.2, effect_sd=0.05)
    assert v == pytest.approx(((0.3 - 0.2) + (0.2 + 0.1 * 0.4 - 0.01 - 0.0025) / 4) / 2 + 0.0025)
    assert difference_variance(0.0, 50, 4, 3, 0.3, 0.3) == pytest.approx(0.3 / 12)


def test_one_seed_per_arm_has_no_verdict_so_no_power():
    assert power(0.3, 50, 4, 1) == 0.0 and mde(50, 4, 1) == math.inf
    assert power(0.3, 50, 4, 1, seed_sd=0.0) == 0.0  # not even when seeds are assumed not to differ


def test_power_is_at_most_alpha_at_no_effect_and_grows_with_effect_tasks_samples_and_seeds():
    assert 0.01 < power(0.0, 50, 4, 3) <= ALPHA + 0.002  # its false-positive rate under the model (quadrature: ±0.002)
    by_effect = [power(d, 50, 4, 3) for d in (0.02, 0.05, 0.1, 0.2)]
    assert by_effect == sorted(by_effect) and by_effect[-1] > 0.99
    assert power(0.065, 100, 4, 3) > power(0.065, 50, 4, 3) > power(0.065, 10, 4, 3)
    assert power(0.065, 50, 8, 3) > power(0.065, 50, 4, 3)
    assert power(0.065, 50, 4, 5) > power(0.065, 50, 4, 3) > power(0.065, 50, 4, 2)
    assert power(0.065, 50, 4, 3, seed_sd=0.0) > power(0.065, 50, 4, 3) > power(0.065, 50, 4, 3, seed_sd=0.05)
    assert power(-0.065, 50, 4, 3) > 0.3  # two-sided
    assert power(0.3, 5, 4, 10) == 0.0  # 2/2^5 > 0.05: the sign-flip half of the rule cannot reject


def test_mde_and_power_are_inverse_and_mde_follows_the_design():
    for design in [(50, 4, 3), (50, 1, 2), (10, 4, 5), (30, 4, 3), (200, 2, 2)]:
        m = mde(*design)
        assert power(m, *design) == pytest.approx(POWER, abs=1e-3)
        assert power(m * 0.9, *design) < POWER
    assert mde(50, 4, 5) < mde(50, 4, 3) < mde(50, 4, 2)
    assert mde(50, 4, 3, power=0.9) > mde(50, 4, 3)
    assert mde(50, 4, 3, alpha=ALPHA / 3) > mde(50, 4, 3)  # a Holm family of 3
    assert mde(50, 4, 3, flip_rate=0.05) < mde(50, 4, 3)
    assert mde(50, 4, 3, seed_sd=0.0) < mde(50, 4, 3)
    assert mde(5, 4, 10) == math.inf


def test_required_design_counts_seeds_and_sees_the_task_bound():
    need = required_design(0.065, 50, 4, 1)
    assert not need.bounded_by_tasks and need.samples is None  # no number of samples makes one seed a verdict
    assert power(0.065, 50, 4, need.seeds) >= POWER > power(0.065, 50, 4, need.seeds - 1)
    assert need.describe() == f"+6.5 points at 80% power needs {need.seeds} seeds per arm at 4 samples per task"
    at3 = required_design(0.065, 50, 4, 3, seed_sd=0.0)
    assert power(0.065, 50, at3.samples, 3, seed_sd=0.0) >= POWER > power(0.065, 50, at3.samples - 1, 3, seed_sd=0.0)
    # Whole-seed noise does not shrink with samples: with the default seed SD only seeds reach the target.
    assert required_design(0.065, 50, 4, 3).samples is None
    bounded = required_design(0.065, 10, 4, 1, effect_sd=0.15)
    assert bounded.bounded_by_tasks and bounded.power_limit < POWER
    assert "not reachable with 10 tasks" in bounded.describe()
    with pytest.raises(ValueError, match="non-zero"):
        required_design(0.0, 50, 4, 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"flip_rate": 0.5}, "flip_rate"),
        ({"within_flip_rate": 0.3}, "within_flip_rate"),
        ({"baseline": 1.0}, "baseline"),
        ({"seeds": 0}, "seeds"),
        ({"samples": 2.5}, "samples"),
        ({"effect_sd": -0.1}, "effect_sd"),
        ({"seed_sd": 0.7}, "seed_sd"),
    ],
)
def test_design_arguments_are_checked(kwargs, field):
    args = {"effect": 0.05, "tasks": 50, "samples": 4, "seeds": 3, "baseline": 0.175, "flip_rate": 0.16}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"^{field}"):
        power(**args)


# ---------------------------------------------------------------------------------------------------------
# The design file


def test_study_design_round_trip_and_errors():
    d = StudyDesign(50, 4, 2, 0.175, 0.2, 0.16, 0.03, 3)
    assert StudyDesign.from_dict(json.loads(d.to_json())) == d
    ok = {"tasks": 50, "samples": 4, "seeds": 1, "baseline": 0.175, "flip_rate": 0.16}
    old = StudyDesign.from_dict(ok)  # a file written before seed_sd and comparisons existed
    assert (old.within_flip_rate, old.seed_sd, old.comparisons) == (None, None, 1)
    assert old.planning()["seed_sd"] == DEFAULT_SEED_SD
    for bad, msg in [
        ({**ok, "flip": 1}, "unknown field 'flip'; valid: tasks, samples"),
        ({k: v for k, v in ok.items() if k != "seeds"}, "field 'seeds' is missing"),
        ({**ok, "tasks": "50"}, "field 'tasks': expected a whole number ≥ 1 (got '50')"),
        ({**ok, "samples": True}, "field 'samples'"),
        ({**ok, "baseline": 1.5}, "field 'baseline': expected a number in"),
        ({**ok, "flip_rate": 0.4}, "field 'flip_rate': flip_rate must be in"),
        ({**ok, "seed_sd": 0.8}, "field 'seed_sd': seed_sd must be in [0, 0.5]"),
        ({**ok, "comparisons": 0}, "field 'comparisons': expected a whole number ≥ 1 (got 0)"),
    ]:
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            StudyDesign.from_dict(bad)
    with pytest.raises(ValueError, match="JSON object"):
        StudyDesign.from_dict([1, 2])  # type: ignore[arg-type]


def test_study_design_mde_is_the_rules_at_alpha_over_the_family():
    d = StudyDesign(50, 4, 3, 0.2, 0.2, 0.18, 0.01, 3)
    assert d.mde() == mde(50, 4, 3, 0.2, 0.2, ALPHA / 3, within_flip_rate=0.18, seed_sd=0.01)


def test_study_design_from_outcomes():
    rng = np.random.default_rng(0)
    p = rng.random(50)
    o = Outcomes.from_array(rng.random((2, 50, 4)) < p[None, :, None])
    d = StudyDesign.from_outcomes(o)
    assert (d.tasks, d.samples, d.seeds, d.baseline) == (50, 4, 2, rate(o))
    assert d.flip_rate == flip_rate(o) and d.within_flip_rate <= d.flip_rate and d.seed_sd is not None
    one = StudyDesign.from_outcomes(Outcomes.from_array(o.data[:1]))
    assert one.flip_rate == within_seed_flip_rate(Outcomes.from_array(o.data[:1])) and one.seed_sd is None
    with pytest.raises(ValueError, match="measures no flip rate"):
        StudyDesign.from_outcomes(Outcomes.from_array(o.data[:1, :, :1]))
    # Two seeds at opposite extremes disagree on everything: clipped to what the planning model allows.
    extreme = StudyDesign.from_outcomes(Outcomes.from_array(np.array([[[1, 1]] * 5, [[0, 0]] * 5], dtype=bool)))
    assert (extreme.baseline, extreme.flip_rate, extreme.within_flip_rate) == (0.5, 0.5, 0.0)
    StudyDesign.from_dict(json.loads(extreme.to_json()))  # valid for `longhaul power --from-comparison`


def test_study_design_for_a_comparison_carries_its_seed_sd_and_family():
    rng = np.random.default_rng(1)
    p = rng.random(30)
    a = Outcomes.from_array(rng.random((3, 30, 4)) < p[None, :, None])
    b = Outcomes.from_array(rng.random((2, 30, 2)) < p[None, :, None])
    r = compare_arms(a, b)
    d = StudyDesign.for_comparison(a, b, r, comparisons=4)
    assert (d.tasks, d.samples, d.seeds, d.comparisons) == (30, 2, 2, 4)
    assert (
        d.seed_sd == r.seed_sd
        and d.baseline == rate(a)
        and d.flip_rate == min(flip_rate(a), 2 * d.baseline * (1 - d.baseline))
    )
    single = Outcomes.from_array(a.data[:1, :, :1])  # one seed, one sample: nothing measured, the default flip rate
    d1 = StudyDesign.for_comparison(single, Outcomes.from_array(b.data[:1, :, :1]), compare_arms(single, single))
    assert (d1.flip_rate, d1.seed_sd, d1.seeds) == (
        min(DEFAULT_FLIP_RATE, 2 * d1.baseline * (1 - d1.baseline)),
        None,
        1,
    )
