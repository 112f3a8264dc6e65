"""The CPU update uses veRL's own loss functions; it moves the policy in the direction of the advantages."""

import pytest
import torch

from longhaul.spec import build_experiment
from longhaul.trainer.batch import build_episode_tokens, collate, response_log_probs
from longhaul.trainer.checkpoint import TRACKER_FILE, latest_step, load_state, save_checkpoint, saved_steps
from longhaul.trainer.update import build_actor_config, compute_loss, update_policy

pytestmark = pytest.mark.verl


def _exp(**alg):
    doc = {"apiVersion": "longhaul.dev/v1alpha1", "kind": "Experiment", "metadata": {"name": "t"},
           "spec": {"resources": {"gpus_per_node": 0}, "algorithm": {"trainer": "single_process", "group_size": 2,
                                                                       "train_batch_size": 1, "ppo_mini_batch_size": 1,
                                                                       **alg}}}
    return build_experiment(doc)


def test_loss_equals_verl_formula_at_ratio_one():
    cfg = build_actor_config(_exp(kl={"use_kl_loss": False}))
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]])
    adv = torch.tensor([[1.0, 1, 0, 0], [-0.5, -0.5, -0.5, -0.5]])
    lp = torch.log(torch.full((2, 4), 0.3))
    terms = compute_loss(lp, lp.clone(), None, adv, mask, cfg)
    # seq-mean-token-mean: mean over sequences of each sequence's token mean of −A·ratio (ratio = 1).
    assert terms.pg_loss == pytest.approx(((-1.0) + 0.5) / 2, abs=1e-6)
    assert terms.metrics["actor/pg_clipfrac"] == 0.0


def test_kl_term_uses_verl_kl_penalty():
    cfg = build_actor_config(_exp(kl={"use_kl_loss": True, "coef": 0.5, "type": "kl"}))
    mask = torch.ones(1, 3)
    lp, ref = torch.full((1, 3), -1.0), torch.full((1, 3), -1.5)
    terms = compute_loss(lp, lp.clone(), ref, torch.zeros(1, 3), mask, cfg)
    assert terms.kl_loss == pytest.approx(0.5)  # k1 = logp − ref
    assert float(terms.loss) == pytest.approx(0.5 * 0.5)


def test_update_raises_logprob_of_positive_advantage_episode(tokenizer, model, tools, make_conversation):
    exp = _exp(learning_rate=1e-2, kl={"use_kl_loss": False})
    cfg = build_actor_config(exp)
    eps = [build_episode_tokens(tokenizer, make_conversation(r), tools, 4096) for r in ("Sure.", "No way, goodbye.")]
    batch = collate(eps, tokenizer.pad_token_id)
    with torch.no_grad():
        old = response_log_probs(model, batch)
    adv = torch.stack([torch.full((batch.response_mask.shape[1],), 1.0), torch.full((batch.response_mask.shape[1],), -1.0)])
    adv = adv * batch.response_mask
    opt = torch.optim.AdamW(model.parameters(), lr=exp.spec.algorithm.learning_rate)
    metrics = update_policy(model, opt, batch, old, None, adv, cfg)
    assert {"actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"} <= set(metrics)
    with torch.no_grad():
        new = response_log_probs(model, batch)
    m = batch.response_mask
    delta = ((new - old) * m).sum(1) / m.sum(1)
    # Shared tokens (tool call, template) get opposite pushes; what differs must move apart.
    assert delta[0] > 0 and delta[0] > delta[1]


def test_checkpoints_are_verl_layout_and_resumable(tmp_path, tokenizer, model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert latest_step(tmp_path) is None
    save_checkpoint(tmp_path, 1, model, tokenizer, opt, {"mean_logprob": -3.0})
    save_checkpoint(tmp_path, 2, model, tokenizer, opt, {"mean_logprob": -2.5})
    assert (tmp_path / TRACKER_FILE).read_text().strip() == "2"
    assert latest_step(tmp_path) == 2 and saved_steps(tmp_path) == [1, 2]
    assert load_state(tmp_path, 2)["mean_logprob"] == -2.5
    assert (tmp_path / "global_step_2" / "huggingface" / "config.json").is_file()
    assert (tmp_path / "global_step_2" / "optimizer.pt").is_file()
    assert not list(tmp_path.glob(".*tmp*"))
    # A half-written step (no trainer_state.json) is never reported as saved.
    (tmp_path / "global_step_3" / "huggingface").mkdir(parents=True)
    assert saved_steps(tmp_path) == [1, 2]


def test_micro_batches_give_the_mini_batch_gradient(tokenizer, tools, make_conversation):
    """Accumulating micro-batch losses with the mini-batch's normalisers equals one full-batch step (veRL's rule)."""
    from longhaul.tiny.models import TinyArch, build_model

    arch = TinyArch(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=2048)
    eps = [build_episode_tokens(tokenizer, make_conversation(r), tools, 4096)
           for r in ("Sure.", "No.", "Let me look into that.", "Done, goodbye.")]
    batch = collate(eps, tokenizer.pad_token_id)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5]).unsqueeze(1) * batch.response_mask
    grads = []
    for micro in (4, 1):
        model = build_model(arch, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, seed=0).eval()
        cfg = build_actor_config(_exp(kl={"use_kl_loss": False}, ppo_micro_batch_size_per_gpu=micro))
        with torch.no_grad():
            old = response_log_probs(model, batch)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        update_policy(model, opt, batch, old, None, adv, cfg, grad_clip=1e9)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)
