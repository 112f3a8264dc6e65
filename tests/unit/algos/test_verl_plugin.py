"""The estimators inside real veRL 0.9.1 (CPU): registration through the entry point, config reading, agreement
with veRL's own grpo, and LATA's exact A/√L through veRL's `agg_loss`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from longhaul.algos import ESTIMATOR_NAMES, estimator_name, render_algorithm_overrides, settings_from_spec
from longhaul.algos.settings import LonghaulSettings

pytestmark = pytest.mark.verl

SPECS = Path(__file__).resolve().parents[3] / "specs"


@pytest.fixture(scope="module")
def core_algos():
    import verl  # noqa: F401  (loads the entry-point plugins)
    from verl.trainer.ppo import core_algos

    return core_algos


def algo_config(**lh):
    from omegaconf import OmegaConf

    base = {
        "alpha": 1.05,
        "discount_unit": "turn",
        "length_exponent": 0.5,
        "seed_compat": False,
        "credit": "trajectory",
        "process_weight": 0.0,
    }
    base.update(lh)
    return OmegaConf.create({"adv_estimator": "longhaul_lata", "norm_adv_by_std_in_grpo": True, "longhaul": base})


def batch(seed=0, bs=8, T=30):
    g = torch.Generator().manual_seed(seed)
    m = (torch.rand(bs, T, generator=g) > 0.3).long()
    m[:, 0] = 1
    r = torch.zeros(bs, T)
    last = T - 1 - torch.argmax(m.flip(1), dim=1)
    r[torch.arange(bs), last] = torch.randint(0, 2, (bs,), generator=g).float()
    index = np.array([f"p{i // 4}" for i in range(bs)], dtype=object)
    return r, m, index


def test_import_verl_registers_every_estimator(core_algos):
    for name in ESTIMATOR_NAMES:
        fn = core_algos.get_adv_estimator_fn(name)
        assert fn.__module__ == "longhaul.algos.verl_plugin"


def test_longhaul_grpo_equals_verl_grpo(core_algos):
    r, m, index = batch()
    want, _ = core_algos.compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=True)
    got, _ = core_algos.get_adv_estimator_fn("longhaul_grpo")(
        token_level_rewards=r, response_mask=m, index=index, config=algo_config()
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    cfg = algo_config()
    cfg.norm_adv_by_std_in_grpo = False
    want, _ = core_algos.compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=False)
    got, _ = core_algos.get_adv_estimator_fn("longhaul_grpo")(
        token_level_rewards=r, response_mask=m, index=index, config=cfg
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_missing_settings_name_the_override(core_algos):
    from omegaconf import OmegaConf

    r, m, index = batch()
    fn = core_algos.get_adv_estimator_fn("longhaul_turn_discount")
    with pytest.raises(ValueError, match=r"\+algorithm\.longhaul\.alpha"):
        fn(
            token_level_rewards=r,
            response_mask=m,
            index=index,
            config=OmegaConf.create({"norm_adv_by_std_in_grpo": True}),
        )


def test_lata_exact_a_over_sqrt_l_through_agg_loss(core_algos):
    """Estimator A·√L + seq-mean-token-mean == per-token A/√L (loss and gradient)."""
    r, m, index = batch(seed=1, bs=8, T=50)
    adv, _ = core_algos.get_adv_estimator_fn("longhaul_lata")(
        token_level_rewards=r, response_mask=m, index=index, config=algo_config()
    )
    grpo, _ = core_algos.compute_grpo_outcome_advantage(r, m, index)
    L = m.sum(1, keepdim=True).float()
    logp = torch.randn(*r.shape, dtype=torch.float32, requires_grad=True)
    ratio = torch.exp(logp - logp.detach())
    loss = core_algos.agg_loss(-adv * ratio, m, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    ratio2 = torch.exp(logp2 - logp2.detach())
    n_seq = (L.squeeze(1) > 0).sum()
    ref = (-(grpo / L.sqrt()) * ratio2 * m).sum() / n_seq
    (grad2,) = torch.autograd.grad(ref, logp2)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, grad2, rtol=1e-5, atol=1e-8)
    # The per-token weight is A/√L_i up to the 1/#sequences constant.
    torch.testing.assert_close(
        (grad * n_seq)[m.bool()], (-(grpo / L.sqrt()).expand_as(grad))[m.bool()], rtol=1e-4, atol=1e-6
    )


def test_seed_compat_lata_is_original_formula(core_algos):
    r, m, index = batch(seed=2)
    cfg = algo_config(seed_compat=True, discount_unit="token")
    adv, _ = core_algos.get_adv_estimator_fn("longhaul_lata")(
        token_level_rewards=r, response_mask=m, index=index, config=cfg
    )
    grpo, _ = core_algos.compute_grpo_outcome_advantage(r, m, index)
    # Original: A · w_t · m / sqrt(L), w_t ∝ 1.05^(L-1-t) over absolute positions, mean 1 over valid tokens.
    T = r.shape[1]
    t = torch.arange(T, dtype=torch.float64)
    L = m.sum(1, keepdim=True).double()
    raw = torch.where(m.bool(), 1.05 ** (L - 1 - t), torch.zeros(1, dtype=torch.float64))
    w = raw / raw.sum(1, keepdim=True) * L
    want = (grpo.double() * w / L.sqrt()).float()
    torch.testing.assert_close(adv, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec_file", sorted(p.name for p in SPECS.glob("*.yaml")))
def test_shipped_specs_settings_round_trip(spec_file, core_algos):
    from omegaconf import OmegaConf

    from longhaul.spec.load import load_spec

    exp = load_spec(SPECS / spec_file)
    name = estimator_name(exp)
    settings = settings_from_spec(exp)
    assert set(settings) == {"alpha", "discount_unit", "length_exponent", "seed_compat", "credit", "process_weight"}
    assert core_algos.get_adv_estimator_fn(name) is not None
    overrides = render_algorithm_overrides(exp)
    assert overrides[0] == f"algorithm.adv_estimator={name}"
    # Parse the rendered '+algorithm.longhaul.k=v' back the way Hydra would and read it as the plugin does.
    lh = {
        o.split("=", 1)[0].rsplit(".", 1)[1]: o.split("=", 1)[1]
        for o in overrides
        if o.startswith("+algorithm.longhaul.")
    }
    cfg = OmegaConf.create(
        {
            "norm_adv_by_std_in_grpo": exp.spec.algorithm.norm_adv_by_std,
            "longhaul": {k: OmegaConf.create({"v": v}).v for k, v in lh.items()},
        }
    )
    back = LonghaulSettings.from_config(cfg)
    assert back.alpha == settings["alpha"] and back.credit == settings["credit"]
    assert back.seed_compat == settings["seed_compat"] and back.discount_unit == settings["discount_unit"]


def test_hydra_accepts_the_overrides(core_algos):
    """The rendered overrides compose against veRL's real ppo_trainer config."""
    import os

    import verl
    from hydra import compose, initialize_config_dir

    from longhaul.spec.load import load_spec

    exp = (
        load_spec(SPECS / "prm_lite_lata.yaml")
        if (SPECS / "prm_lite_lata.yaml").exists()
        else load_spec(next(SPECS.glob("*.yaml")))
    )
    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=render_algorithm_overrides(exp))
    s = LonghaulSettings.from_config(cfg.algorithm)
    assert cfg.algorithm.adv_estimator == estimator_name(exp)
    assert s.alpha == exp.spec.algorithm.alpha
