"""The measurements of the one-GPU check. Each returns plain numbers (bytes) or None where the device is the CPU.

Where each mirrors the pinned veRL 0.9.1 sources is said in its docstring; on CUDA the figures are
`torch.cuda.max_memory_allocated` / `max_memory_reserved` around the stage, and, for the per-process context,
`mem_get_info` read from outside a child process.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time

import torch
from check_model import head_in_root

SKIPPED = "skipped: needs CUDA"


class Meter:
    """Peak allocation and reservation of a stage, relative to what was allocated when it began (CUDA only)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.base = 0

    def __enter__(self) -> Meter:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def allocated(self) -> int | None:
        """Bytes allocated now (None off CUDA)."""
        return torch.cuda.memory_allocated() if self.cuda else None

    def peak_extra(self) -> int | None:
        """Peak allocated bytes above the stage's start (None off CUDA)."""
        return torch.cuda.max_memory_allocated() - self.base if self.cuda else None

    def peak_reserved(self) -> int | None:
        """Peak bytes the caching allocator held during the stage (None off CUDA)."""
        return torch.cuda.max_memory_reserved() if self.cuda else None


@contextlib.contextmanager
def expandable_segments(device: torch.device, enable: bool):
    """veRL's `set_expandable_segments` (verl/utils/device.py): the actor trains with expandable segments on and
    `update_weights` turns them off for the sync. A no-op off CUDA or where torch lacks the setting."""
    setter = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)
    if device.type != "cuda" or setter is None:
        yield
        return
    setter(f"expandable_segments:{enable}")
    try:
        yield
    finally:
        setter("expandable_segments:False")


def stage_sync(model, settings: dict, device: torch.device, dry: bool) -> dict:
    """The actor's side of veRL's colocated weight sync, `ActorRolloutRefWorker.update_weights` (naive backend,
    verl/workers/engine_workers.py): `FSDPEngine.get_per_tensor_param` then `BucketedWeightSender`.

    * LoRA, adapters not merged, `base_sync_done` (the rollout loaded the base from the checkpoint: `load_format`
      is not dummy). Gather step: `load_fsdp_model_to_gpu` (the shards are on the GPU here already), then
      `collect_lora_params(layered_summon=False)`: `FSDP.summon_full_params(module, writeback=False)` (FSDP1's
      API on an FSDP2 module; called as veRL does, it finds no FSDP1 state) around PEFT's adapter state dict,
      each tensor `.full_tensor().detach().cpu()`. Send step: the model back on the host when `param_offload`,
      then the sender's CUDA-IPC bucket (`update_weights_bucket_megabytes`) filled from the host adapters.
    * Full weights: the bucket, then `module.state_dict()` one tensor at a time, `param.to(device).full_tensor()`
      copied into the bucket (gather and send interleave in veRL's generator).
    `--dry` caps the bucket at 16 MiB of host memory.
    """
    if settings["lora_rank"] > 0 and (settings["lora_merge"] or "dummy" in settings["load_format"]):
        return {"skipped": "merged-LoRA and first-sync (load_format dummy) exports are not mirrored"}
    bucket_bytes = min(settings["bucket_mb"] << 20, 16 << 20) if dry else settings["bucket_mb"] << 20
    out: dict = {"tensors": 0, "exported_bytes": 0}
    t0 = time.monotonic()
    with expandable_segments(device, False):
        if settings["lora_rank"] > 0:
            with Meter(device) as meter:
                out["shards_on_gpu"] = meter.allocated()
                from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

                with FSDP.summon_full_params(model, writeback=False):
                    adapters = {k: v for k, v in model.state_dict().items() if "lora_" in k}
                    gathered = [
                        (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for v in adapters.values()
                    ]
                _empty_cache(device)
                out.update(export_peak_extra=meter.peak_extra(), gather_reserved=meter.peak_reserved())
            out["tensors"] = len(gathered)
            out["exported_bytes"] = sum(t.numel() * t.element_size() for t in gathered)
            offload = settings["param_offload"]  # on the CPU these moves are no-ops, but the same calls
            if offload:
                model.to("cpu")  # offload_fsdp2_model_to_cpu
                _empty_cache(device)
            with Meter(device) as meter:
                bucket = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
                _fill_bucket(bucket, gathered)
                out.update(bucket_peak_extra=meter.peak_extra(), send_reserved=meter.peak_reserved())
                del bucket
            _empty_cache(device)
            if offload:
                model.to(device)  # load_fsdp_model_to_gpu, for the training stage that follows
        else:
            with Meter(device) as meter:
                out["shards_on_gpu"] = meter.allocated()
                bucket = torch.empty(bucket_bytes, dtype=torch.uint8, device=device)
                for param in model.state_dict().values():
                    full = param.to(device, non_blocking=True)
                    full = full.full_tensor() if hasattr(full, "full_tensor") else full
                    _fill_bucket(bucket, [full])
                    out["tensors"] += 1
                    out["exported_bytes"] += full.numel() * full.element_size()  # what crosses to the rollout
                    del full
                del bucket
                _empty_cache(device)
                out.update(export_peak_extra=meter.peak_extra(), send_reserved=meter.peak_reserved())
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _fill_bucket(bucket: torch.Tensor, tensors) -> None:
    """Copy tensors into the bucket back to back, starting over when it is full (the sender flushes then)."""
    offset = 0
    for t in tensors:
        raw = t.detach().contiguous().view(-1).view(torch.uint8)
        if raw.numel() > bucket.numel():
            continue  # veRL sends a tensor larger than the bucket on its own (_direct_send_large_weight)
        if offset + raw.numel() > bucket.numel():
            offset = 0
        bucket[offset : offset + raw.numel()].copy_(raw, non_blocking=True)
        offset += raw.numel()


def _inputs(vocab: int, micro: int, seq: int, packed: bool, device: torch.device):
    if packed:  # veRL's remove-padding layout: one row of micro x seq tokens, positions restart per sequence
        ids = torch.randint(0, vocab, (1, micro * seq), device=device)
        pos = torch.arange(seq, device=device).repeat(micro).unsqueeze(0)
        return ids, pos
    return torch.randint(0, vocab, (micro, seq), device=device), None


def _ppo_loss(logp: torch.Tensor) -> torch.Tensor:
    """A PPO-clip objective with a low-variance KL term on the token log-probs (veRL's loss is elementwise over
    tokens too: its memory is that of a few token-sized vectors)."""
    old = logp.detach() + 0.01
    ref = logp.detach() - 0.01
    adv = torch.ones_like(logp)
    ratio = torch.exp(logp - old)
    surrogate = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    return (surrogate + 0.01 * kl).mean()


def stage_training(model, fused, settings: dict, micro: int, seq: int, packed: bool, device: torch.device) -> dict:
    """One actor update at the spec's longest micro-batch, as `FSDPEngine.forward_backward_batch` then
    `optimizer_step` run it: forward through the root (FSDP2 unshards unit by unit, checkpointed layers keep only
    their inputs), veRL's fused log-probs, the PPO loss, backward (reduce-scatter of fp32 gradients), then
    AdamW (veRL's default `actor.optim`). Two iterations: the second, with AdamW's states resident, is measured.
    `model` has `check_model.ppo_forward` bound as its forward and is sharded as a veRL worker shards it with
    longhaul's fix: an untied lm_head in the root unit, unsharded with it through forward and backward."""
    if not settings["use_fused_kernels"]:
        return {"skipped": "use_fused_kernels=false: the unfused training step is not mirrored (see the logits stage)"}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
    vocab = model.config.vocab_size
    out: dict = {"micro": micro, "seq": seq, "packed": packed, "lm_head_in_root_unit": head_in_root(model)}
    with expandable_segments(device, True):
        # off CUDA nothing is measured: one iteration runs the code path
        iterations = 2 if device.type == "cuda" else 1
        for it in range(1, iterations + 1):
            optimizer.zero_grad(set_to_none=True)
            with Meter(device) as meter:
                t0 = time.monotonic()
                static = meter.allocated()
                ids, pos = _inputs(vocab, micro, seq, packed, device)
                # through the root module's __call__, so FSDP2's root hooks run as in veRL's forward
                logp, _entropy = model(ids, pos, fused=fused, chunk_size=settings["fused_chunk_size"])
                _ppo_loss(logp).backward()
                del logp, _entropy
                after_backward = meter.allocated()
                fwd_bwd_peak = meter.peak_extra()
                optimizer.step()
            if it == iterations:
                out.update(
                    static=static,
                    grads=None if static is None else after_backward - static,
                    fwd_bwd_peak_extra=fwd_bwd_peak,
                    step_peak_extra=meter.peak_extra(),
                    peak_reserved=meter.peak_reserved(),
                    seconds=round(time.monotonic() - t0, 2),
                )
    out["optimizer_states"] = _state_bytes(optimizer)
    del optimizer
    return out


def _state_bytes(optimizer) -> int:
    """AdamW's state bytes on this rank (DTensor states count their local shard; the step counters are scalars)."""
    size = 0
    for state in optimizer.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                local = t.to_local() if hasattr(t, "to_local") else t
                size += local.numel() * local.element_size()
    return size


def stage_logits(fused, hidden: int, vocab: int, tokens: int, settings: dict, device: torch.device, cap: int) -> dict:
    """Log-probs of `tokens` tokens from bf16 hidden states and the bf16 (unsharded) output weight, forward and
    backward: veRL's fused kernel (chunks of `fused_chunk_size` rows), and the unfused path (full logits, fp32
    log-softmax, gather; veRL's fallback when flash-attn's cross-entropy is absent) at up to `cap` tokens,
    scaled linearly to `tokens` (every term of it is per token)."""
    dtype = torch.bfloat16
    weight = torch.randn(vocab, hidden, device=device, dtype=dtype) * 0.02
    out = {"tokens": tokens}
    for name, n in (("fused", tokens), ("unfused", min(tokens, cap))):
        h = (torch.randn(n, hidden, device=device, dtype=dtype) * 0.1).requires_grad_(True)
        labels = torch.randint(0, vocab, (n,), device=device)
        with Meter(device) as meter:
            t0 = time.monotonic()
            if name == "fused":
                logp, _ = fused.FusedLinearForPPOFunction.apply(h, weight, labels, 1.0, settings["fused_chunk_size"])
            else:
                logits = h @ weight.t()
                logp = logits.float().log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
                del logits
            logp.sum().backward()
            del logp
            peak = meter.peak_extra()
        out[name] = {"tokens_run": n, "peak_extra": peak, "seconds": round(time.monotonic() - t0, 2)}
        if peak is not None:
            out[name]["at_tokens"] = int(peak * tokens / n)
        del h, labels
    return out


_CHILD = r"""
import os, sys, torch, torch.distributed as dist
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print("cuda", flush=True); sys.stdin.readline()
a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16); (a @ a).sum().item()
print("cublas", flush=True); sys.stdin.readline()
store = dist.FileStore(sys.argv[1], 1)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
t = torch.ones(1 << 20, device="cuda"); dist.all_reduce(t); torch.cuda.synchronize()
print("nccl", flush=True); sys.stdin.readline()
dist.destroy_process_group()
"""


def stage_context(device: torch.device) -> dict:
    """GPU memory a fresh trainer-like process takes before it allocates a tensor of its own: CUDA context,
    then cuBLAS's handle and workspace, then an NCCL communicator after one all-reduce — read from this process
    with `mem_get_info` (driver-level: what other tenants of the GPU lose). One rank only: NCCL refuses two ranks
    on one GPU, so the per-peer buffers of a 2-rank communicator are not in the figure."""
    if device.type != "cuda":
        return {"skipped": SKIPPED}
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, f"{tmp}/store"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            for step in ("cuda", "cublas", "nccl"):
                line = child.stdout.readline().strip()
                if line != step:
                    out["error"] = f"child stopped before {step!r} (got {line!r})"
                    break
                time.sleep(0.5)  # the driver's accounting settles after the allocation returns
                out[step] = free0 - torch.cuda.mem_get_info()[0]
                child.stdin.write("\n")
                child.stdin.flush()
        finally:
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return out
