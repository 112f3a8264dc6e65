import torch

from longhaul.trainer.batch import EpisodeTokens, build_episode_tokens, collate, response_log_probs


def test_response_mask_covers_exactly_the_assistant_turns(tokenizer, tools, make_conversation):
    ep = build_episode_tokens(tokenizer, make_conversation(), tools, max_length=4096)
    assert isinstance(ep, EpisodeTokens)
    # Two assistant turns → two runs of 1s; the tool result and the user's reply between/after are 0.
    runs = sum(1 for i, m in enumerate(ep.response_mask) if m and (i == 0 or not ep.response_mask[i - 1]))
    assert runs == 2
    policy_text = tokenizer.decode([t for t, m in zip(ep.response_ids, ep.response_mask, strict=True) if m])
    other_text = tokenizer.decode([t for t, m in zip(ep.response_ids, ep.response_mask, strict=True) if not m])
    assert "Sure, let me check." in policy_text and "get_reservation_details" in policy_text
    assert "confirmed" in other_text and "Thanks" in other_text
    assert "confirmed" not in policy_text
    assert ep.response_mask[0] == 1  # the response starts with the first generated token


def test_log_probs_of_padded_batch_match_single_sequences(tokenizer, model, tools, make_conversation):
    eps = [build_episode_tokens(tokenizer, make_conversation(r), tools, 4096) for r in ("Sure.", "Let me check that for you now.")]
    batch = collate(eps, tokenizer.pad_token_id)
    with torch.no_grad():
        together = response_log_probs(model, batch)
        for i, ep in enumerate(eps):
            alone = response_log_probs(model, collate([ep], tokenizer.pad_token_id))
            n = len(ep.response_ids)
            torch.testing.assert_close(together[i, :n], alone[0, :n], atol=1e-4, rtol=1e-4)
            assert torch.all(together[i, n:] == 0)
    assert torch.all(together[batch.response_mask.bool()] < 0)
