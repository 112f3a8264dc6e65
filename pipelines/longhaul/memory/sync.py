"""The weight sync (training → rollout) under veRL 0.9.1's FSDP2 actor: what it allocates, as formulas (pure).

Every GPU spec renders `actor_rollout_ref.{actor,ref}.strategy=fsdp2`; the sync is the `naive` checkpoint
backend's colocated path, `ActorRolloutRefWorker.update_weights` (verl/workers/engine_workers.py), which
resumes the vLLM weights, asks the engine for a generator of `(name, tensor)` pairs,
`FSDPEngine.get_per_tensor_param` (verl/workers/engine/fsdp/transformer_impl.py), and streams it into the
co-located vLLM worker with `BucketedWeightSender.async_send_weights`
(verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py, called by `ServerAdapter.update_weights` in
vllm_rollout.py). What that source allocates, per trainer rank (= per trainer GPU):

- The bucket: `_init_buffer` allocates `torch.empty(update_weights_bucket_megabytes << 20, uint8)` on the GPU
  before the first tensor and frees it after the last (`rollout.checkpoint_engine.update_weights_bucket_megabytes`,
  2048 in veRL's rollout.yaml). Tensors are copied into it in their own dtype (the sender does not cast); a
  tensor larger than the bucket is sent by itself (`_direct_send_large_weight`, a CUDA-IPC handle of the tensor:
  no copy).
- Full fine-tuning: FSDP2 without LoRA skips the whole-model staging (`_skip_staging`): the generator gathers one
  parameter at a time, `param.to(device).full_tensor()`, in the master dtype (`fsdp_config.model_dtype`, fp32;
  no cast on this path). The consumer still holds the previous tensor while the next is gathered (the loop
  variable of `async_send_weights`, `ensure_async_iterator`'s `item`, `unfuse_moe_params`' loop variable), so two
  consecutive full tensors are alive at once, plus, with `param_offload`, the GPU copy of the host shard being
  gathered (`.to(device)` of a 1/world shard). Shards stay on the GPU only without `param_offload`.
- LoRA (`model.lora.merge: false`, veRL's default; longhaul does not render merge or `layered_summon`):
  `get_per_tensor_param` loads every shard onto the GPU (`load_fsdp_model_to_gpu`), and `collect_lora_params`
  (verl/utils/fsdp_utils.py; `FSDP.summon_full_params` finds no FSDP1 state on an FSDP2 module) gathers each
  adapter tensor with `full_tensor()` and copies it to the host at once (`.detach().cpu()`): one fp32 adapter
  tensor in flight on the GPU, all of them in a host dict. The shards go back to the host
  (`offload_fsdp_model_to_cpu`, with `param_offload`) before the send, whose bucket then holds host tensors.
  The vLLM worker on the same GPU clones what it receives twice before `add_lora` (`update_weights_from_ipc`'s
  `lora_weights` and `_update_weights`, verl/workers/rollout/vllm_rollout/utils.py): two copies of the adapters.
  With `rollout.load_format: dummy` (veRL's default) the first sync also sends the base weights
  (`base_sync_done` is false): `collect_lora_params` moves the module to the host and gathers every base tensor
  there (the fp32 base model per rank in host RAM), sent through the same bucket; the vLLM worker loads them in
  place. A host tensor larger than the bucket cannot be sent (the direct path rebuilds CUDA-IPC handles only).

Per GPU the peak is the larger step: LoRA: max(shards + one adapter tensor, bucket + the vLLM worker's two adapter
copies [+ shards without param_offload]); full fine-tuning: [shards without param_offload +] bucket + two
consecutive full tensors [+ a shard copy with param_offload].
"""

from __future__ import annotations

from dataclasses import dataclass

from longhaul.memory.shapes import LINEAR_MODULES, ModelShape


def export_elements(shape: ModelShape) -> tuple[int, ...]:
    """Elements of each tensor in the order `get_per_tensor_param` yields them: the Hugging Face state dict of a
    Qwen2/Qwen3/Llama causal LM — embed_tokens; per block q/k/v (weight, then bias with qkv_bias), o_proj,
    q_norm/k_norm (Qwen3), gate/up/down, the two RMSNorms; the final norm; lm_head (also with tied embeddings:
    the state dict names the shared parameter twice and each name is gathered)."""
    h = shape.hidden_size
    block: list[int] = []
    for lin in shape.linears():
        block.append(lin.fan_in * lin.fan_out)
        if lin.bias:
            block.append(lin.fan_out)
        if lin.name == "o_proj" and shape.qk_norm:
            block += [shape.head_dim, shape.head_dim]
    block += [h, h]
    embedding = shape.vocab_size * h
    return (embedding, *(block * shape.num_layers), h, embedding)


def adapter_elements(shape: ModelShape, rank: int, targets: str | list[str]) -> tuple[int, ...]:
    """Elements of each LoRA tensor of one block (lora_A: rank × fan_in, lora_B: fan_out × rank) for the adapted
    linears ("all-linear": every linear of the blocks, as PEFT resolves it)."""
    names = set(LINEAR_MODULES) if targets == "all-linear" else set(targets)
    out: list[int] = []
    for lin in shape.linears():
        if lin.name in names:
            out += [rank * lin.fan_in, lin.fan_out * rank]
    return tuple(out)


def in_flight_bytes(sizes: tuple[int, ...], *, world: int, shard_copy: bool) -> int:
    """The sender's gathered tensors at their peak (full fine-tuning): the largest sum of two consecutive full
    tensors, plus the GPU copy of the gathered tensor's 1/world host shard when `shard_copy` (param_offload)."""
    shard = (lambda b: b // world) if shard_copy else (lambda b: 0)
    pairs = [sizes[0] + shard(sizes[0])]
    pairs += [a + b + shard(b) for a, b in zip(sizes, sizes[1:], strict=False)]
    return max(pairs)


@dataclass(frozen=True)
class SyncStep:
    """One step of the sync on a trainer GPU: labelled bytes (the trainer process and the co-located vLLM worker's
    transients; the woken engine weights and the CUDA context are booked by the plan)."""

    title: str
    rows: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(v for _, v in self.rows)


@dataclass(frozen=True)
class SyncEstimate:
    """The weight sync on one trainer rank: its GPU steps, and what it keeps in host RAM at the worst sync."""

    steps: tuple[SyncStep, ...]
    bucket: int
    in_flight: int  # gathered tensors alive on the GPU at once (full: a consecutive pair; LoRA: one adapter)
    host_adapters: int  # LoRA: the gathered adapters' host dict (alive through the send)
    host_base: int  # LoRA, first sync with load_format dummy: the base model gathered on the host
    host_shards: int  # the shards while the send runs with param_offload
    largest_host_tensor: int  # LoRA base sync: the largest host tensor the bucket has to hold (0 otherwise)

    @property
    def peak(self) -> SyncStep:
        return max(self.steps, key=lambda s: s.total)

    @property
    def host(self) -> int:
        return self.host_adapters + self.host_base + self.host_shards

    @property
    def host_tensor_over_bucket(self) -> bool:
        """veRL 0.9.1 cannot send a host tensor larger than the bucket (the first LoRA sync's base weights)."""
        return self.largest_host_tensor > self.bucket


def estimate_sync(
    shape: ModelShape,
    *,
    world: int,
    lora_rank: int,
    lora_targets: str | list[str],
    master_size: int,
    shards: int,
    param_offload: bool,
    bucket: int,
    base_sync: bool,
) -> SyncEstimate:
    """The rule of the module docstring. `shards`: this rank's parameter shards (master dtype); `bucket`: bytes;
    `base_sync`: the first sync sends the base weights (LoRA with `rollout.load_format: dummy`)."""
    resident = 0 if param_offload else shards
    kept = (("actor parameters (param_offload off: stay on the GPU)", resident),) if resident else ()
    mib = bucket >> 20
    bucket_row = (f"weight-sync bucket (update_weights_bucket_megabytes {mib})", bucket)
    if lora_rank <= 0:
        flight = in_flight_bytes(
            tuple(n * master_size for n in export_elements(shape)), world=world, shard_copy=param_offload
        )
        copy = " + the gathered tensor's shard copy" if param_offload else ""
        step = SyncStep(
            "export: full tensors gathered one by one into the bucket",
            (*kept, bucket_row, (f"gathered tensors in flight (2 consecutive fp{8 * master_size}{copy})", flight)),
        )
        return SyncEstimate((step,), bucket, flight, 0, 0, shards if param_offload else 0, 0)
    adapters = adapter_elements(shape, lora_rank, lora_targets)
    flight = max(adapters) * master_size
    total = shape.num_layers * sum(adapters) * master_size
    gather = SyncStep(
        "gather adapters: shards on the GPU, one adapter tensor at a time to the host",
        (
            ("actor parameters (loaded onto the GPU to gather the adapters)", shards),
            ("adapter tensor in flight", flight),
        ),
    )
    send = SyncStep(
        "send: the bucket, the vLLM worker's two copies of the adapters",
        (*kept, bucket_row, (f"vLLM: received adapters, 2 copies (fp{8 * master_size})", 2 * total)),
    )
    base = shape.total_params() * master_size if base_sync else 0
    largest = max(export_elements(shape)) * master_size if base_sync else 0
    return SyncEstimate((gather, send), bucket, flight, total, base, shards if param_offload else 0, largest)
