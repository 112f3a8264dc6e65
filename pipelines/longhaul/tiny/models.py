"""Tiny Qwen2 architectures for the CPU smoke run (policy and user simulator share the tokenizer), and a tiny
Qwen3 one for the thinking-mode tests (`longhaul.tiny.qwen3`).

Sizes: vLLM's CPU attention needs a head dimension of at least 32; the context must hold the system prompt
(policy text + 14 tool schemas, about 4k tokens with the tiny tokenizer) plus a short conversation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TinyArch:
    """Qwen2 hyper-parameters of one tiny model."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 16384

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


POLICY_ARCH = TinyArch(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
USER_ARCH = TinyArch(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
)


def _common_config(arch: TinyArch, *, vocab_size: int, eos_token_id: int, pad_token_id: int) -> dict[str, Any]:
    """The config values both tiny families share (tied embeddings, float32, no sliding window)."""
    if arch.head_dim < 32:
        raise ValueError(f"head dimension {arch.head_dim} < 32: vLLM's CPU attention needs at least 32")
    return {
        **asdict(arch),
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "use_sliding_window": False,
        "torch_dtype": "float32",
    }


def build_qwen2_config(arch: TinyArch, *, vocab_size: int, eos_token_id: int, pad_token_id: int) -> Any:
    """A `Qwen2Config` for `arch` (tied embeddings, float32 weights)."""
    # deferred: transformers (~1 s)
    from transformers import Qwen2Config

    return Qwen2Config(
        **_common_config(arch, vocab_size=vocab_size, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    )


def build_qwen3_config(arch: TinyArch, *, vocab_size: int, eos_token_id: int, pad_token_id: int) -> Any:
    """A `Qwen3Config` for `arch` (explicit head_dim, q/k norms, no attention bias; tied embeddings, float32)."""
    # deferred: transformers (~1 s)
    from transformers import Qwen3Config

    return Qwen3Config(
        **_common_config(arch, vocab_size=vocab_size, eos_token_id=eos_token_id, pad_token_id=pad_token_id),
        head_dim=arch.head_dim,
        attention_bias=False,
    )


def build_model(
    arch: TinyArch, *, vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int, family: str = "qwen2"
) -> Any:
    """A randomly initialised `Qwen2ForCausalLM` (or `Qwen3ForCausalLM` for family "qwen3"), seeded."""
    # deferred: torch and transformers (~2 s)
    import torch
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM

    build_config, cls = {
        "qwen2": (build_qwen2_config, Qwen2ForCausalLM),
        "qwen3": (build_qwen3_config, Qwen3ForCausalLM),
    }[family]
    config = build_config(arch, vocab_size=vocab_size, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    torch.manual_seed(seed)
    return cls(config).float()
