"""Model shapes of the one-GPU memory check: the published config values of the Qwen checkpoints longhaul's GPU
specs train (and the smaller Qwen2.5 shapes of the planner sweep), and the tiny same-family shapes of `--dry`.

Standard library only: `prepare.py` reads this table (to write the sweep's config.json files for `longhaul plan`)
in longhaul's venv, and the check reads it on a GPU machine that has neither longhaul nor veRL.
"""

from __future__ import annotations

#: Fields of a Qwen2.5 config.json that every size shares (the Hugging Face repositories' config.json).
_QWEN25 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

#: config.json values per checkpoint, as published (base and -Instruct checkpoints have the same shape).
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": {
        **_QWEN25,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-1.5B-Instruct": {
        **_QWEN25,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-3B-Instruct": {
        **_QWEN25,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-7B-Instruct": {
        **_QWEN25,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "Qwen/Qwen3-8B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
}
for _size in ("0.5B", "1.5B", "3B", "7B"):
    PUBLISHED[f"Qwen/Qwen2.5-{_size}"] = PUBLISHED[f"Qwen/Qwen2.5-{_size}-Instruct"]

#: The planner sweep: smaller Qwen2.5 shapes planned and measured with one shipped spec's actor settings, so the
#: activation figures are compared at 0.5B-7B, not only at the shipped 7B/8B.
SWEEP = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct")

#: `--dry` keeps each case's architecture (model type, tied or untied embeddings, explicit head_dim) at a size
#: a CPU runs in milliseconds; 1024 tokens of vocabulary keep the fused kernel's chunks real.
_TINY = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
}


def published_config(model_id: str) -> dict | None:
    """The published config.json values of `model_id`, or None when this table does not have it."""
    cfg = PUBLISHED.get(model_id)
    return dict(cfg) if cfg is not None else None


def tiny_config(model_id: str) -> dict | None:
    """A tiny config of the same family as `model_id` (same model type and embedding tying), for `--dry`."""
    cfg = published_config(model_id)
    if cfg is None:
        return None
    cfg.update(_TINY)
    for token in ("bos_token_id", "eos_token_id"):  # the real ids lie outside the tiny vocabulary
        cfg.pop(token, None)
    if "head_dim" in cfg:
        cfg["head_dim"] = _TINY["hidden_size"] // _TINY["num_attention_heads"]
    return cfg
