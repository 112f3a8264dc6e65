"""Model shapes and the component formulas (pure): parameter counts against the published model sizes, KV bytes
per token, AWQ storage, LoRA counts, GPU capacities, activations with and without checkpointing."""

from __future__ import annotations

import pytest

from longhaul.memory.estimate import (
    activation_bytes,
    estimate_engine,
    estimate_trainer,
    kv_bytes_per_token,
    logits_bytes,
    weight_bytes,
)
from longhaul.memory.gpus import GiB, MiB, gpu_capacity
from longhaul.memory.shapes import BUILTIN_CONFIGS, ShapeError, builtin_shape, shape_from_config

QWEN7B = builtin_shape("Qwen/Qwen2.5-7B-Instruct")
QWEN72B_AWQ = builtin_shape("Qwen/Qwen2.5-72B-Instruct-AWQ")
QWEN3_8B = builtin_shape("Qwen/Qwen3-8B")


def test_builtin_parameter_counts_match_the_published_sizes() -> None:
    # The model cards' counts: Qwen2.5-7B 7.61 B (7,615,616,512), Qwen3-8B 8.19 B (8,190,735,360).
    assert QWEN7B.total_params() == 7_615_616_512
    assert QWEN3_8B.total_params() == 8_190_735_360
    assert set(BUILTIN_CONFIGS) == {"Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-72B-Instruct-AWQ", "Qwen/Qwen3-8B"}


def test_awq_weights_match_the_checkpoint_size() -> None:
    # Qwen2.5-72B-Instruct-AWQ's safetensors total about 41.6 GB: 4-bit weights + fp16 scales/zeros per group of
    # 128, fp16 embeddings and head.
    total = weight_bytes(QWEN72B_AWQ, 2, "awq_marlin")
    assert 41.0e9 < total < 42.2e9
    assert weight_bytes(QWEN72B_AWQ, 2, "awq") == total
    assert weight_bytes(QWEN7B, 2) == 2 * QWEN7B.total_params()
    assert weight_bytes(QWEN7B, 2, "fp8") < weight_bytes(QWEN7B, 2)


def test_kv_bytes_per_token() -> None:
    # 2 (K, V) × layers × KV heads on the rank × head_dim × 2 bytes
    assert kv_bytes_per_token(QWEN7B, 1, 2) == 2 * 28 * 4 * 128 * 2 == 57_344
    assert kv_bytes_per_token(QWEN7B, 2, 2) == 57_344 // 2
    assert kv_bytes_per_token(QWEN72B_AWQ, 2, 2) == 2 * 80 * 4 * 128 * 2
    assert kv_bytes_per_token(QWEN7B, 8, 2) == 2 * 28 * 1 * 128 * 2  # fewer KV heads than ranks: replicated


def test_lora_parameter_count() -> None:
    # rank × (fan_in + fan_out) over q,k,v,o,gate,up,down in 28 blocks
    per_layer = 16 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3)
    assert QWEN7B.lora_params(16, "all-linear") == 28 * per_layer == 40_370_176
    assert QWEN7B.lora_params(16, ["q_proj", "v_proj"]) == 28 * 16 * ((3584 + 3584) + (3584 + 512))
    assert QWEN7B.lora_params(0, "all-linear") == 0


def test_shape_from_config_reads_a_config_and_refuses_what_it_cannot_model() -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "vocab_size": 100,
    }
    shape = shape_from_config(cfg, "x/config.json")
    assert shape.num_kv_heads == 2 and shape.head_dim == 32 and not shape.qkv_bias and not shape.tie_word_embeddings
    with pytest.raises(ShapeError, match="model_type 'qwen3_moe' is not modelled.*supported: qwen2"):
        shape_from_config({**cfg, "model_type": "qwen3_moe"}, "x/config.json")
    with pytest.raises(ShapeError, match="x/config.json: `hidden_size` must be an integer from 1 to 16,777,216"):
        shape_from_config({**cfg, "hidden_size": None}, "x/config.json")
    with pytest.raises(ShapeError, match="`vocab_size` must be an integer from 1 to 16,777,216 .got 1000000000000"):
        shape_from_config({**cfg, "vocab_size": 10**12}, "x/config.json")  # issue 30: a plan of absurd sizes


def test_gpu_capacities() -> None:
    assert gpu_capacity("a800").bytes == gpu_capacity("A100").bytes == 80 * GiB
    assert gpu_capacity("h200").bytes == 143771 * MiB and gpu_capacity("NVIDIA-H100").known
    assert 44 * GiB < gpu_capacity("l40s").bytes < 48 * GiB
    unknown = gpu_capacity("mi300x")
    assert not unknown.known and unknown.bytes == 80 * GiB and "unknown GPU type 'mi300x'" in unknown.warning()
    assert "no GPU type set" in gpu_capacity(None).warning()


def test_engine_preallocates_its_share_and_the_rest_is_kv() -> None:
    e = estimate_engine(
        QWEN7B,
        capacity=80 * GiB,
        gpu_memory_utilization=0.5,
        tp=1,
        dtype_size=2,
        quantization="none",
        max_model_len=24576,
        max_num_seqs=12,
        batched_tokens=24576,
        enforce_eager=False,
    )
    assert e.footprint == 40 * GiB
    assert e.weights + e.lora_slot + e.overhead + e.kv_cache == e.footprint
    assert e.kv_tokens == e.kv_cache // 57_344 and e.starts and e.demanded_tokens == 12 * 24576
    small = estimate_engine(
        QWEN7B,
        capacity=80 * GiB,
        gpu_memory_utilization=0.2,
        tp=1,
        dtype_size=2,
        quantization="none",
        max_model_len=24576,
        max_num_seqs=12,
        batched_tokens=24576,
        enforce_eager=True,
    )
    assert small.kv_cache < 0 and not small.starts and small.cuda_graphs == 0


def test_trainer_full_finetune_is_16_bytes_per_parameter_and_checkpointing_saves_activations() -> None:
    t = estimate_trainer(
        QWEN7B,
        world=1,
        lora_rank=0,
        lora_targets="all-linear",
        master_size=4,
        compute_size=2,
        micro_batch=1,
        seq_len=4096,
        checkpointing=True,
        eager_attention=False,
        fused_kernels=True,
        separate_reference=True,
        reference_size=4,
    )
    assert t.params + t.grads + t.optimizer == 16 * QWEN7B.total_params()
    assert t.activations < t.activations_other / 5 and t.logits == 0 and t.gathered == 0
    assert t.reference_host == 4 * QWEN7B.total_params() and 0 < t.reference_step < t.update
    lora = estimate_trainer(
        QWEN7B,
        world=2,
        lora_rank=16,
        lora_targets="all-linear",
        master_size=4,
        compute_size=2,
        micro_batch=1,
        seq_len=4096,
        checkpointing=True,
        eager_attention=True,
        fused_kernels=False,
        separate_reference=False,
        reference_size=4,
    )
    assert lora.grads == 40_370_176 * 4 // 2 and lora.optimizer == 2 * lora.grads
    assert lora.params == (QWEN7B.total_params() + 40_370_176) * 4 // 2
    assert lora.attention_scores > 0 and lora.logits == logits_bytes(QWEN7B, 4096, 2, fused=False) > 0
    # Activations scale with tokens.
    assert activation_bytes(QWEN7B, 2048, 2, checkpointing=True) * 2 == activation_bytes(
        QWEN7B, 4096, 2, checkpointing=True
    )
