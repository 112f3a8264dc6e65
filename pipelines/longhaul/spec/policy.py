"""`spec.policy`: the trained policy, its LoRA adapters, its rollout engine and its thinking mode."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from longhaul.spec.base import FieldError, SpecModel
from longhaul.spec.bounds import MAX_LORA_ALPHA, MAX_LORA_RANK, Fraction, Seqs, TensorParallel, Tokens
from longhaul.spec.serving import ModelRef, Sampling
from longhaul.spec.strings import SafeToken


class DType(StrEnum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class AttnImplementation(StrEnum):
    FLASH_ATTENTION_2 = "flash_attention_2"
    SDPA = "sdpa"
    EAGER = "eager"


class ThinkingMode(StrEnum):
    DISABLED = "disabled"
    KEEP = "keep"
    STRIP = "strip"


#: Policy models whose chat template has a thinking mode (`<think>` blocks, `enable_thinking`): the Qwen3 hybrid
#: release (`Qwen/Qwen3-8B`, `…/tiny-qwen3-policy`), read from `policy.model.name`. The 2507 Instruct / Thinking
#: releases (one mode only) and later families (Qwen3.5) have other templates and are not matched.
THINKING_MODEL_NAME = re.compile(r"(?i)(^|[/-])qwen3-(?!.*2507)")


def model_thinks(model_name: str) -> bool:
    """Whether a policy model's chat template has Qwen3's hybrid thinking mode (by its name)."""
    return bool(THINKING_MODEL_NAME.search(model_name))


class RolloutSpec(SpecModel):
    """The policy's vLLM rollout engine inside the trainer (and the policy server used for evaluation)."""

    engine: Literal["vllm"] = Field(default="vllm", description="Rollout engine (veRL server mode).")
    tensor_parallel_size: TensorParallel = Field(default=1, description="Tensor-parallel size of the policy engine.")
    gpu_memory_utilization: Fraction = Field(default=0.45, description="vLLM memory fraction per GPU.")
    max_model_len: Tokens = Field(default=24576, description="Maximum context length of the policy engine.")
    max_num_seqs: Seqs = Field(default=12, description="Maximum concurrent sequences.")
    max_num_batched_tokens: Tokens = Field(default=24576, description="Maximum batched tokens per step.")
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs.")
    free_cache_engine: bool = Field(
        default=True,
        description="Put the engine to sleep while the trainer runs (veRL's rollout.free_cache_engine): its KV cache "
        "and weights leave the GPU. false keeps its whole gpu_memory_utilization share during training (faster "
        "switches, less room for the update; `longhaul plan` counts it).",
    )
    train: Sampling = Field(default_factory=Sampling, description="Sampling for training rollouts.")
    validation: Sampling = Field(
        default_factory=Sampling, description="Sampling for validation and evaluation rollouts (same everywhere)."
    )


class LoraSpec(SpecModel):
    rank: int = Field(default=16, ge=0, le=MAX_LORA_RANK, description="LoRA rank; 0 = full fine-tuning.")
    alpha: int = Field(default=32, ge=1, le=MAX_LORA_ALPHA, description="LoRA alpha.")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout (SFT stage).")
    target_modules: Literal["all-linear"] | list[SafeToken] = Field(
        default="all-linear", description="Modules that receive adapters."
    )


class PolicySpec(SpecModel):
    model: ModelRef = Field(
        default_factory=lambda: ModelRef(name="Qwen/Qwen2.5-7B-Instruct"), description="Policy model."
    )
    dtype: DType = Field(default=DType.BFLOAT16, description="Training and serving dtype.")
    attn_implementation: AttnImplementation = Field(
        default=AttnImplementation.FLASH_ATTENTION_2, description="Attention implementation of the trainer."
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="LoRA adapters (rank 0 = full fine-tuning).")
    gradient_checkpointing: bool = Field(default=True, description="Activation checkpointing in the actor.")
    use_fused_kernels: bool = Field(default=True, description="veRL fused log-prob kernels (no full logits).")
    param_offload: bool = Field(default=True, description="FSDP parameter offload.")
    optimizer_offload: bool = Field(default=True, description="FSDP optimizer offload.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout engine settings.")
    thinking: ThinkingMode = Field(
        default=ThinkingMode.DISABLED,
        description="Reasoning (`<think>`) blocks of a Qwen3 hybrid-thinking policy, the same in training, "
        "evaluation and SFT. disabled: every generation prompt opens with an empty think block "
        "(`enable_thinking=false`) and every assistant turn is rendered with it, so the policy answers without "
        "thinking; the only value for models without a thinking mode (e.g. Qwen2.5), where it changes nothing. "
        "keep: the policy thinks, and every earlier turn's think block stays in its context verbatim (as "
        "token-in/token-out training keeps it; evaluation and SFT render it with longhaul's Qwen3 template), "
        "and SFT labels include the think blocks. strip: Qwen3's own multi-turn rendering, which drops earlier "
        "turns' think blocks; then a turn's context is not a prefix of the conversation that follows it, so "
        "training, evaluation and SFT masks cannot agree: evaluation-only specs (stages: [eval]). Default "
        "disabled: it is valid for every model, keeps the response budget for tool calls (the airline tools "
        "include `think` for explicit reasoning) and keeps runs comparable with non-thinking policies. A Qwen3 "
        "policy is recognised by its model name (`Qwen/Qwen3-8B`, `org/qwen3-8b-agent`; not the 2507 releases).",
    )

    @model_validator(mode="after")
    def _thinking(self) -> PolicySpec:
        if self.thinking != ThinkingMode.DISABLED and not model_thinks(self.model.name):
            raise FieldError(
                "thinking",
                f"'{self.thinking}' needs a Qwen3 hybrid-thinking policy (a model name like "
                f"Qwen/Qwen3-8B); '{self.model.name}' has no thinking mode: use thinking: disabled",
            )
        return self
