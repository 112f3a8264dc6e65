"""Episodes → token tensors: re-tokenize each episode's messages with the policy's chat template.

The prompt is everything up to the first assistant turn's generation prompt; the response is the rest, with
`response_mask` = 1 exactly on the tokens the policy generated (Render-Twice-Diff spans of
`longhaul.sft.masking`), 0 on tool results, user messages and padding — veRL's layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from longhaul.sft.masking import Dropped, build_supervised_example


@dataclass(frozen=True)
class EpisodeTokens:
    """One episode as token ids: prompt, response, and the policy-token mask over the response."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.response_mask)


def build_episode_tokens(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: list[dict] | None,
                         max_length: int) -> EpisodeTokens | Dropped:
    """Tokens of one episode, or why it cannot be used (no assistant turn, template prefix mismatch, too long)."""
    ex = build_supervised_example(tokenizer, messages, tools, max_length=max_length, min_label_tokens=1)
    if isinstance(ex, Dropped):
        return ex
    start = ex.spans[0][0]
    mask = [0] * (len(ex.input_ids) - start)
    for a, b in ex.spans:
        for i in range(a, b):
            mask[i - start] = 1
    return EpisodeTokens(ex.input_ids[:start], ex.input_ids[start:], mask)


@dataclass
class TokenBatch:
    """Right-padded full sequences plus where each response sits, in veRL's (bs, T) response layout."""

    input_ids: torch.Tensor  # (B, S)
    attention_mask: torch.Tensor  # (B, S)
    prompt_lengths: list[int]
    response_lengths: list[int]
    response_mask: torch.Tensor  # (B, T) float, T = max response length

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


def collate(episodes: Sequence[EpisodeTokens], pad_id: int) -> TokenBatch:
    """Pad a list of episodes into one batch."""
    if not episodes:
        raise ValueError("collate: no episodes")
    seqs = [e.prompt_ids + e.response_ids for e in episodes]
    s_max = max(len(s) for s in seqs)
    t_max = max(len(e.response_ids) for e in episodes)
    ids = torch.full((len(seqs), s_max), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), s_max), dtype=torch.long)
    rmask = torch.zeros((len(seqs), t_max), dtype=torch.float32)
    for i, (s, e) in enumerate(zip(seqs, episodes, strict=True)):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        att[i, : len(s)] = 1
        rmask[i, : len(e.response_mask)] = torch.tensor(e.response_mask, dtype=torch.float32)
    return TokenBatch(ids, att, [len(e.prompt_ids) for e in episodes], [len(e.response_ids) for e in episodes], rmask)


def select(batch: TokenBatch, rows: Sequence[int]) -> TokenBatch:
    """The sub-batch of `rows` (micro-batching), trimmed to its own longest sequence/response."""
    rows = list(rows)
    s_max = max(batch.prompt_lengths[i] + batch.response_lengths[i] for i in rows)
    t_max = max(batch.response_lengths[i] for i in rows)
    return TokenBatch(batch.input_ids[rows, :s_max], batch.attention_mask[rows, :s_max],
                      [batch.prompt_lengths[i] for i in rows], [batch.response_lengths[i] for i in rows],
                      batch.response_mask[rows, :t_max])


def response_log_probs(model: Any, batch: TokenBatch) -> torch.Tensor:
    """Log-probability of every response token under `model`, (B, T), zero beyond each response.

    The vocabulary projection runs only over response positions: the prompt (policy text and tool schemas,
    thousands of tokens) is context, and full-sequence logits would dominate memory.
    """
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    t_max = batch.response_mask.shape[1]
    rows = []
    for i, (p, r) in enumerate(zip(batch.prompt_lengths, batch.response_lengths, strict=True)):
        # Token at position q is predicted by the hidden state at q-1.
        logits = head(hidden[i, p - 1 : p - 1 + r]).float()
        target = batch.input_ids[i, p : p + r]
        lp = torch.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        rows.append(torch.nn.functional.pad(lp, (0, t_max - r)))
    return torch.stack(rows)
