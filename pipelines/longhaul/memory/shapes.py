"""Model shapes for the memory planner (pure): parsed from a `config.json` mapping, or from the built-in table.

A shape is what memory depends on: layers, widths, attention heads, vocabulary, tied embeddings, bias and
quantization. Only dense decoder-only models with a gated (SwiGLU) MLP are modelled — the Qwen2/Qwen3/Llama
family that longhaul trains and simulates with. Reading a `config.json` file is I/O and lives in
`longhaul.memory.load`; this module turns the parsed mapping into a `ModelShape`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Architectures the formulas describe: q/k/v/o attention projections (grouped-query) and a gated MLP.
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")

#: PEFT's "all-linear" on these models: every linear layer of the decoder blocks (not lm_head).
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: The fields of each shipped model's `config.json` that the planner reads (values copied from the model
#: cards' config.json on the Hugging Face hub; the 72B AWQ build pads intermediate_size to 29696 so that its
#: 128-wide quantization groups split evenly across tensor-parallel ranks).
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 32768,
    },
    "Qwen/Qwen2.5-72B-Instruct-AWQ": {
        "model_type": "qwen2",
        "hidden_size": 8192,
        "intermediate_size": 29696,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "max_position_embeddings": 32768,
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
    },
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 40960,
    },
}


class ShapeError(ValueError):
    """A config the planner cannot describe (unsupported architecture, missing field)."""


@dataclass(frozen=True)
class Quant:
    """Weight-only quantization of the decoder's linear layers (`quantization_config` of config.json)."""

    method: str
    bits: int
    group_size: int
    zero_point: bool


@dataclass(frozen=True)
class Linear:
    name: str
    fan_in: int
    fan_out: int
    bias: bool


@dataclass(frozen=True)
class ModelShape:
    """What a dense decoder-only model's memory depends on."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    torch_dtype: str | None
    quant: Quant | None
    source: str

    # -- parameter counts ---------------------------------------------------------------------------
    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def linears(self) -> tuple[Linear, ...]:
        """The linear layers of one decoder block."""
        h, i, q, kv, b = self.hidden_size, self.intermediate_size, self.q_width, self.kv_width, self.qkv_bias
        return (
            Linear("q_proj", h, q, b),
            Linear("k_proj", h, kv, b),
            Linear("v_proj", h, kv, b),
            Linear("o_proj", q, h, False),
            Linear("gate_proj", h, i, False),
            Linear("up_proj", h, i, False),
            Linear("down_proj", i, h, False),
        )

    def layer_linear_weights(self) -> int:
        """Weight elements of one block's linear layers (what quantization applies to)."""
        return sum(lin.fan_in * lin.fan_out for lin in self.linears())

    def layer_small_params(self) -> int:
        """Biases and norms of one block (kept in the model dtype under quantization)."""
        biases = sum(lin.fan_out for lin in self.linears() if lin.bias)
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return biases + norms

    def layer_params(self) -> int:
        return self.layer_linear_weights() + self.layer_small_params()

    def embedding_params(self) -> int:
        """Input embedding, output head (unless tied) and the final norm: FSDP's root unit."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.vocab_size * self.hidden_size + head + self.hidden_size

    def total_params(self) -> int:
        return self.num_layers * self.layer_params() + self.embedding_params()

    def lora_params(self, rank: int, targets: str | list[str]) -> int:
        """Trainable LoRA elements: rank × (fan_in + fan_out) per adapted linear, in every block."""
        if rank <= 0:
            return 0
        names = set(LINEAR_MODULES) if targets == "all-linear" else set(targets)
        per_layer = sum(rank * (lin.fan_in + lin.fan_out) for lin in self.linears() if lin.name in names)
        return self.num_layers * per_layer

    def describe(self) -> str:
        quant = f", {self.quant.method.upper()} {self.quant.bits}-bit g{self.quant.group_size}" if self.quant else ""
        return (
            f"{format_count(self.total_params())} parameters{quant}, {self.num_layers} layers, hidden "
            f"{self.hidden_size}, {self.num_kv_heads} KV heads × {self.head_dim} ({self.source})"
        )


def format_count(n: int) -> str:
    """7615616512 → '7.62 B', 40370176 → '40.4 M', 615552 → '615,552'."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


#: The largest dimension, layer count or vocabulary a config.json may state (2^24: far above any real model, far
#: below what makes the plan's arithmetic meaningless).
MAX_CONFIG_INT = 2**24


def _int(cfg: dict[str, Any], key: str, where: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_CONFIG_INT:
        raise ShapeError(f"{where}: `{key}` must be an integer from 1 to {MAX_CONFIG_INT:,} (got {str(v)[:40]})")
    return v


def shape_from_config(cfg: dict[str, Any], source: str) -> ModelShape:
    """A `ModelShape` from a parsed `config.json` mapping; `source` says where it came from (for messages)."""
    if not isinstance(cfg, dict):
        raise ShapeError(f"{source}: config.json must be a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ShapeError(
            f"{source}: model_type {model_type!r} is not modelled by the memory planner; supported: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (dense decoder-only models with a gated MLP)"
        )
    hidden, heads = _int(cfg, "hidden_size", source), _int(cfg, "num_attention_heads", source)
    kv_heads = _int(cfg, "num_key_value_heads", source) if cfg.get("num_key_value_heads") is not None else heads
    head_dim = _int(cfg, "head_dim", source) if cfg.get("head_dim") is not None else hidden // heads
    qc = cfg.get("quantization_config")
    quant = None
    if isinstance(qc, dict) and qc.get("quant_method") in ("awq", "gptq"):
        bits = qc.get("bits", qc.get("w_bit", 4))
        group = qc.get("group_size", qc.get("q_group_size", 128))
        if not isinstance(bits, int) or not isinstance(group, int) or bits <= 0:
            raise ShapeError(f"{source}: quantization_config needs integer `bits` and `group_size`")
        group = group if group > 0 else hidden  # -1 = one group per column
        # AWQ says `zero_point`; GPTQ checkpoints always store a qzeros tensor.
        quant = Quant(str(qc["quant_method"]), bits, group, bool(qc.get("zero_point", True)))
    bias_default = model_type == "qwen2"  # Qwen2 always has q/k/v biases; the others say so in attention_bias
    return ModelShape(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", source),
        num_layers=_int(cfg, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=_int(cfg, "vocab_size", source),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", bias_default)),
        qk_norm=model_type == "qwen3",
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        quant=quant,
        source=source,
    )


def builtin_shape(name: str) -> ModelShape | None:
    """The built-in shape of a shipped model by Hugging Face id, or None."""
    cfg = BUILTIN_CONFIGS.get(name)
    return None if cfg is None else shape_from_config(cfg, "built-in table")
