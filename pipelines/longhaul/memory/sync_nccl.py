"""The weight sync of separate_async (trainer → standalone rollout replicas) under veRL 0.9.1, as formulas (pure).

longhaul renders `rollout.checkpoint_engine.backend=nccl` for separate_async; veRL's `CheckpointEngineManager
.update_weights` (verl/checkpoint_engine/base.py:510-562) then aborts the replicas' requests, frees their KV cache
(`release_kv_cache`: with `free_cache_engine` the vLLM server sleeps and wakes its weights only,
workers/rollout/vllm_rollout/vllm_async_server.py:875-883; the weights stay), builds the NCCL group and streams the
actor's tensors to every rollout GPU. Paths are relative to the installed `verl/` package. Per GPU:

- Every trainer rank: `NCCLCheckpointEngine.prepare` allocates a send and a receive buffer of
  `update_weights_bucket_megabytes` each (checkpoint_engine/nccl_checkpoint_engine.py:165-173; rank 0 through cupy,
  the others through torch: relays broadcast through theirs); `finalize` frees them (:182-193; the NCCL group itself
  stays: `rebuild_group` is false). The actor's export is `get_per_tensor_param()` with its defaults
  (workers/engine_workers.py:764): full fine-tuning streams full tensors gathered one by one in the master dtype, as
  the colocated sync does (`longhaul.memory.sync`: two consecutive tensors in flight, plus a shard copy with
  param_offload), chunked into the buffers (`split_weight_chunks`, base.py:565-591; a tensor larger than the bucket is
  sent in pieces). Full fine-tuning only: with LoRA, `base_sync_done` defaults to false
  (workers/engine/fsdp/transformer_impl.py:977) and `collect_lora_params` sends the base weights without the adapters
  (utils/fsdp_utils.py:761-774), so the spec refuses separate_async with LoRA
  (`longhaul.spec.trainer_mode.check_trainer_lora`).
- Every rollout GPU: the replica's `CheckpointEngineWorker`, a process of its own beside the vLLM worker
  (checkpoint_engine/base.py:304-374; its CUDA context and NCCL communicator stay once made), holds the same two
  buffers (nccl_checkpoint_engine.py:172-173), copies each received tensor into the vLLM worker through
  `BucketedWeightSender`'s own GPU bucket (workers/rollout/vllm_rollout/vllm_rollout.py:235-241,
  bucketed_weight_transfer.py:179-183), and reassembles a tensor larger than the bucket in a full tensor of its own
  first (`merge_weight_chunks`, base.py:594-633), which it hands over by CUDA IPC (no copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from longhaul.memory.shapes import ModelShape
from longhaul.memory.sync import SyncEstimate, SyncStep, export_elements, in_flight_bytes


@dataclass(frozen=True)
class CheckpointSync:
    """The NCCL sync: the sender's steps on each trainer rank, and the receiver's rows on each rollout GPU."""

    sender: SyncEstimate
    receiver: tuple[tuple[str, int], ...]

    @property
    def received(self) -> int:
        return sum(v for _, v in self.receiver)


def estimate_checkpoint_sync(
    shape: ModelShape,
    *,
    world: int,
    master_size: int,
    shards: int,
    param_offload: bool,
    bucket: int,
) -> CheckpointSync:
    """The rule of the module docstring (full fine-tuning). `shards`: a trainer rank's parameter shards (master
    dtype); `bucket`: bytes (update_weights_bucket_megabytes)."""
    mib = bucket >> 20
    buffers = (f"checkpoint-engine send/receive buffers (2 × {mib} MiB)", 2 * bucket)
    kept = (("actor parameters (param_offload off: stay on the GPU)", shards),) if not param_offload else ()
    sizes = tuple(n * master_size for n in export_elements(shape))
    dtype = f"fp{8 * master_size}"
    flight = in_flight_bytes(sizes, world=world, shard_copy=param_offload)
    copy = " + the gathered tensor's shard copy" if param_offload else ""
    step = SyncStep(
        "export: full tensors gathered one by one, chunked through the buffers",
        (*kept, buffers, (f"gathered tensors in flight (2 consecutive {dtype}{copy})", flight)),
    )
    sender = SyncEstimate((step,), bucket, flight, 0, 0, shards if param_offload else 0, 0)
    largest = max(sizes)
    receiver = (
        (f"checkpoint-engine receive buffers (2 × {mib} MiB)", 2 * bucket),
        (f"bucket to the vLLM worker ({mib} MiB)", bucket),
        (f"largest tensor reassembled from chunks ({dtype})", largest if largest > bucket else 0),
    )
    return CheckpointSync(sender, receiver)
