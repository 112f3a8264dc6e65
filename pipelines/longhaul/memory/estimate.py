"""Memory of each component, as formulas over a `ModelShape` (pure; bytes everywhere).

Each function documents its formula and where it comes from. The constants below are the planner's stated
assumptions for things that depend on driver, library version and workload rather than on the spec; the
verdict treats a headroom under `TIGHT_FRACTION` of the GPU as "tight" because these estimates carry about
that much error.

Sources
- vLLM: `gpu_memory_utilization` is a per-instance budget it allocates at start-up (weights, profiled activation
  peak, CUDA graphs, non-torch memory; the rest becomes KV cache) — docs "Engine arguments" and the worker's
  `determine_available_memory`; it refuses to start when the KV cache cannot hold one `max_model_len` sequence.
  Sleep mode: level 1 moves weights to host RAM and drops the KV cache, level 2 drops both (docs "Sleep Mode").
- veRL 0.9.1 (installed): the actor loads its weights in fp32 (`fsdp_config.model_dtype: fp32`) and computes in
  bf16 through FSDP mixed precision (`mixed_precision.param_dtype: bf16`, `reduce_dtype: fp32`); the forward-only
  reference model keeps its parameters on the host (FSDP CPU offload) and is the actor itself, adapters off,
  when LoRA is on (`ref_in_actor`); `param_offload`/`optimizer_offload` move the shards to the host between
  phases (they are back on the GPU for the update); the rollout sleeps at level 1 with LoRA adapters and at
  level 2 otherwise (`vLLMHttpServer._resolve_sleep_level`); the LoRA engine reserves one adapter slot.
- Adam: two fp32 moments per trainable parameter. veRL's fp32 parameters are the master copy, so there is no
  separate one: fp32 params + fp32 grads + 2 fp32 moments = 16 bytes per trainable parameter, the same total as
  the classic bf16 params + bf16 grads + fp32 master + 2 fp32 moments (ZeRO, Rajbhandari et al. 2020, §3).
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1
  (34·h bytes per token per layer in 16-bit plus 5·a·s² for attention scores), re-derived for a gated-MLP,
  grouped-query, dropout-free block with memory-efficient attention (see `activation_elements_per_token`).
- AWQ/GPTQ storage: 4-bit weights packed 8 per int32, one fp16 scale and one packed zero point per group of
  `group_size` input channels per output channel; embeddings, head, norms and biases stay fp16.
"""

from __future__ import annotations

from dataclasses import dataclass

from longhaul.memory.gpus import GiB
from longhaul.memory.shapes import ModelShape

# --- stated assumptions (not derivable from the spec) ------------------------------------------------------
#: CUDA context and library handles of one process on one GPU.
CUDA_CONTEXT = GiB // 2
#: NCCL communicator buffers of a process in a group of more than one rank (TP engines, FSDP trainer).
NCCL_BUFFERS = GiB // 4
#: CUDA-graph pool of a vLLM engine (0 with enforce_eager); vLLM logs 0.3–1.5 GiB for 7–72B models.
CUDA_GRAPHS = GiB // 2
#: Token budget of a `vllm serve` process started without --max-num-batched-tokens (the simulator on GPU): vLLM's
#: online-serving default on large GPUs. The policy engine gets `rollout.max_num_batched_tokens` from the spec.
VLLM_SERVE_BATCHED_TOKENS = 8192
#: fp32 copies of the logits the sampler holds in vLLM's profile run (logits, probabilities, sorted top-p/k).
SAMPLER_COPIES = 4
#: Headroom below this fraction of capacity is reported as "tight".
TIGHT_FRACTION = 0.05

DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}
QUANTIZED_METHODS = ("awq", "awq_marlin", "gptq")


def dtype_bytes(name: str) -> int:
    return DTYPE_BYTES[str(name).lower()]


# --- vLLM engines ------------------------------------------------------------------------------------------


def weight_bytes(shape: ModelShape, dtype_size: int, quantization: str = "none") -> int:
    """Weights of the whole model as an engine holds them.

    none: every parameter × dtype size. awq/awq_marlin/gptq: each decoder linear weight costs bits/8 bytes plus
    (2 + bits/8)/group_size bytes for its group's fp16 scale and packed zero point (no zero point: 2/group_size);
    embeddings, head, norms and biases stay 16-bit. fp8: linear weights 1 byte each, the rest in dtype size.
    """
    linear = shape.num_layers * shape.layer_linear_weights()
    rest = shape.total_params() - linear
    if quantization in QUANTIZED_METHODS:
        bits, group, zero = (
            (shape.quant.bits, shape.quant.group_size, shape.quant.zero_point) if shape.quant else (4, 128, True)
        )
        per_weight = bits / 8 + (2 + (bits / 8 if zero else 0)) / group
        return int(linear * per_weight) + rest * 2
    if quantization == "fp8":
        return linear + rest * dtype_size
    return shape.total_params() * dtype_size


def kv_bytes_per_token(shape: ModelShape, tp: int, kv_dtype_size: int) -> int:
    """KV cache of one token on one GPU: 2 (K and V) × layers × KV heads on this rank × head_dim × bytes.
    KV heads split across TP ranks; with fewer KV heads than ranks vLLM replicates one head per rank."""
    heads = max(1, shape.num_kv_heads // tp)
    return 2 * shape.num_layers * heads * shape.head_dim * kv_dtype_size


def engine_activation_peak(shape: ModelShape, tp: int, act_size: int, batched_tokens: int, max_num_seqs: int) -> int:
    """vLLM's profiled activation peak: one forward of `batched_tokens` tokens — residual and normed hidden
    (2h), q/k/v (on this rank), gate/up and activated MLP outputs (3·I on this rank) — plus the sampler's fp32
    logits for `max_num_seqs` sequences (`SAMPLER_COPIES` copies)."""
    per_token = 2 * shape.hidden_size + (shape.q_width + 2 * shape.kv_width) // tp + 3 * shape.intermediate_size // tp
    return batched_tokens * per_token * act_size + max_num_seqs * shape.vocab_size * 4 * SAMPLER_COPIES


@dataclass(frozen=True)
class EngineEstimate:
    """One vLLM engine on one of its GPUs."""

    footprint: int  # gpu_memory_utilization × capacity, allocated at start-up
    weights: int  # this rank's share
    lora_slot: int  # adapter slot reserved with enable_lora (0 without LoRA)
    activation_peak: int
    cuda_graphs: int
    runtime: int  # CUDA context (+ NCCL with TP > 1)
    kv_cache: int  # what is left for KV cache (may be negative)
    kv_token_bytes: int
    kv_tokens: int
    max_model_len: int
    demanded_tokens: int  # max_num_seqs × max_model_len

    @property
    def overhead(self) -> int:
        return self.activation_peak + self.cuda_graphs + self.runtime

    @property
    def asleep(self) -> int:
        """What stays on the GPU while the engine sleeps: what the sleep allocator does not manage (the CUDA
        context, NCCL buffers and the CUDA-graph pool)."""
        return self.cuda_graphs + self.runtime

    @property
    def starts(self) -> bool:
        """vLLM refuses to start when the KV cache cannot hold one sequence of max_model_len tokens."""
        return self.kv_tokens >= self.max_model_len


def estimate_engine(
    shape: ModelShape,
    *,
    capacity: int,
    gpu_memory_utilization: float,
    tp: int,
    dtype_size: int,
    quantization: str,
    max_model_len: int,
    max_num_seqs: int,
    batched_tokens: int,
    enforce_eager: bool,
    lora_rank: int = 0,
    lora_targets: str | list[str] = "all-linear",
) -> EngineEstimate:
    """KV cache = gpu_memory_utilization × capacity − weights/TP − LoRA slot − activation peak − CUDA graphs −
    runtime; tokens = KV cache ÷ `kv_bytes_per_token`."""
    footprint = int(gpu_memory_utilization * capacity)
    weights = weight_bytes(shape, dtype_size, quantization) // tp
    lora = shape.lora_params(lora_rank, lora_targets) * dtype_size // tp  # max_loras = 1 (veRL)
    act = engine_activation_peak(shape, tp, dtype_size, batched_tokens, max_num_seqs)
    graphs = 0 if enforce_eager else CUDA_GRAPHS
    runtime = CUDA_CONTEXT + (NCCL_BUFFERS if tp > 1 else 0)
    kv = footprint - weights - lora - act - graphs - runtime
    per_token = kv_bytes_per_token(shape, tp, dtype_size)
    return EngineEstimate(
        footprint,
        weights,
        lora,
        act,
        graphs,
        runtime,
        kv,
        per_token,
        max(0, kv) // per_token,
        max_model_len,
        max_num_seqs * max_model_len,
    )


# --- FSDP trainer ------------------------------------------------------------------------------------------


def activation_elements_per_token(shape: ModelShape) -> int:
    """Tensors one decoder block saves for backward, per token, in compute-dtype elements (no checkpointing):

    two RMSNorm inputs kept in fp32 (2 × 2h), the q/k/v projection input (h), q, k, v (h_q + 2·h_kv), the
    pre-rotary q and k (h_q + h_kv), the attention output feeding o_proj (h_q), the MLP input (h), and the gate,
    up, activated-gate and product tensors of the gated MLP (4·I) = 6h + 3·h_q + 3·h_kv + 4·I.
    Korthikanti et al.'s 34·h bytes (= 17h elements, 4h MLP, with dropout masks) is the same count for a GeLU
    MLP; attention scores are not kept by flash/memory-efficient attention (see `attention_score_bytes`).
    """
    return 6 * shape.hidden_size + 3 * shape.q_width + 3 * shape.kv_width + 4 * shape.intermediate_size


def activation_bytes(shape: ModelShape, tokens: int, compute_size: int, *, checkpointing: bool) -> int:
    """Activations of one micro-batch at the peak of backward.

    With gradient checkpointing (per block, as Hugging Face does it): every block keeps its input (h per
    token) and the block being recomputed holds its full set; without: every block keeps its full set. Both add
    the gradient temporaries of the widest operation in flight (2·I + 2h per token).
    """
    per_layer = activation_elements_per_token(shape)
    saved = shape.num_layers * (shape.hidden_size if checkpointing else per_layer)
    working = (per_layer if checkpointing else 0) + 2 * shape.intermediate_size + 2 * shape.hidden_size
    return tokens * (saved + working) * compute_size


def attention_score_bytes(shape: ModelShape, seqs: int, seq_len: int, compute_size: int, *, checkpointing: bool) -> int:
    """Eager attention keeps the softmax output (fp32) and its compute-dtype copy: heads × s² × (4 + c) per
    sequence per block (Korthikanti's 5·a·s² term); every block without checkpointing, one with it."""
    blocks = 1 if checkpointing else shape.num_layers
    return blocks * seqs * shape.num_heads * seq_len * seq_len * (4 + compute_size)


def logits_bytes(shape: ModelShape, tokens: int, compute_size: int, *, fused: bool) -> int:
    """Full logits of the micro-batch (compute dtype), their fp32 log-softmax and its fp32 gradient:
    tokens × vocab × (c + 8). veRL's fused kernels compute log-probs in chunks without them: 0."""
    return 0 if fused else tokens * shape.vocab_size * (compute_size + 8)


def unit_working_set(shape: ModelShape, compute_size: int) -> int:
    """Unsharded FSDP units in the compute dtype: the root unit (embeddings, head, final norm), which stays
    unsharded through forward and backward, plus two blocks (the one computing and the one prefetched)."""
    return (shape.embedding_params() + 2 * shape.layer_params()) * compute_size


def gathered_bytes(shape: ModelShape, compute_size: int, *, full_finetune: bool, world: int) -> int:
    """The actor's FSDP all-gather working set (nothing when one rank holds everything): `unit_working_set`,
    plus, for full fine-tuning, the unsharded fp32 gradients of the root and one block before their
    reduce-scatter."""
    if world <= 1:
        return 0
    grads = (shape.embedding_params() + shape.layer_params()) * 4 if full_finetune else 0
    return unit_working_set(shape, compute_size) + grads


@dataclass(frozen=True)
class TrainerEstimate:
    """The FSDP actor (and reference) on one rank."""

    world: int
    total_params: int
    trainable: int
    master_size: int
    compute_size: int
    params: int
    grads: int
    optimizer: int
    gathered: int
    tokens: int
    seqs: int
    seq_len: int
    activations: int
    activations_other: int  # the same with the other gradient_checkpointing setting
    attention_scores: int
    logits: int
    separate_reference: bool
    reference_step: int  # the reference log-prob step's working set (forward only, before the update)
    reference_host: int  # this rank's reference shard, kept on the host

    @property
    def update(self) -> int:
        """The actor update step's peak (everything on the GPU: offloaded shards are loaded back for it)."""
        return (
            self.params
            + self.grads
            + self.optimizer
            + self.gathered
            + self.activations
            + self.attention_scores
            + self.logits
        )


def estimate_trainer(
    shape: ModelShape,
    *,
    world: int,
    lora_rank: int,
    lora_targets: str | list[str],
    master_size: int,
    compute_size: int,
    micro_batch: int,
    seq_len: int,
    checkpointing: bool,
    eager_attention: bool,
    fused_kernels: bool,
    separate_reference: bool,
    reference_size: int,
) -> TrainerEstimate:
    """Per-rank FSDP (full shard over `world` ranks) figures for one actor update.

    parameters = all parameters × master size / world; gradients = trainable × master size / world; AdamW =
    2 × trainable × master size / world; the micro-batch is `micro_batch` sequences of `seq_len` tokens (worst
    case: every sequence at max_prompt_tokens + max_response_tokens).
    """
    total = shape.total_params()
    trainable = shape.lora_params(lora_rank, lora_targets) if lora_rank > 0 else total
    if lora_rank > 0:
        total += trainable
    tokens = micro_batch * seq_len

    def acts(gc: bool) -> int:
        return activation_bytes(shape, tokens, compute_size, checkpointing=gc)

    scores = (
        attention_score_bytes(shape, micro_batch, seq_len, compute_size, checkpointing=checkpointing)
        if eager_attention
        else 0
    )
    gathered = gathered_bytes(shape, compute_size, full_finetune=lora_rank == 0, world=world)
    ref_step = 0
    if separate_reference:
        # Forward only, parameters streamed from the host unit by unit (FSDP CPU offload): the unsharded units,
        # one block's activations in flight, and the logits for the log-probs (no gradient).
        ref_step = (
            unit_working_set(shape, compute_size)
            + tokens * activation_elements_per_token(shape) * compute_size
            + logits_bytes(shape, tokens, compute_size, fused=fused_kernels) * (compute_size + 4) // (compute_size + 8)
        )
    return TrainerEstimate(
        world=world,
        total_params=total,
        trainable=trainable,
        master_size=master_size,
        compute_size=compute_size,
        params=total * master_size // world,
        grads=trainable * master_size // world,
        optimizer=2 * trainable * master_size // world,
        gathered=gathered,
        tokens=tokens,
        seqs=micro_batch,
        seq_len=seq_len,
        activations=acts(checkpointing),
        activations_other=acts(not checkpointing),
        attention_scores=scores,
        logits=logits_bytes(shape, tokens, compute_size, fused=fused_kernels),
        separate_reference=separate_reference,
        reference_step=ref_step,
        reference_host=shape.total_params() * reference_size // world if separate_reference else 0,
    )
