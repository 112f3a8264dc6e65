"""What veRL 0.9.1's weight sync really allocates, measured on CPU for a tiny Qwen2 under the FSDP2 settings longhaul
renders for its GPU specs, against the planner's rule (`longhaul.memory.sync.estimate_sync`) within 15 %.

Two gloo ranks (this file run as a script, once per rank: `support.ranks`) each build veRL's own `FSDPEngineWithLMHead`
(FSDP2, fp32 master weights, the spec's LoRA and offload settings) on the `cpu` platform, then run what the
colocated sync (`ActorRolloutRefWorker.update_weights`, naive backend) runs: `engine.get_per_tensor_param(...)`
consumed by veRL's `BucketedWeightSender.async_send_weights`, with veRL's `BucketedWeightReceiver` as the vLLM
side in a thread (it drops what it receives). On CPU veRL picks the shared-memory bucket (`use_shm`: no CUDA IPC),
so the bucket is a shared-memory segment rather than a device allocation: its size is recorded where veRL
creates it, and the rest is measured.

Measurement: torch's profiler with `profile_memory` receives every allocation and free of c10's CPU allocator
(size, time) on the exporting thread — the CPU counterpart of `torch.cuda.max_memory_allocated`, and unlike
tracemalloc it sees tensor storage. The peak of the running sum over the export is the sync's extra allocation
(the engine's shards exist before it starts). The receiver thread's bookkeeping is not the trainer's and is not
counted.

What this cannot show on CPU: the host and the device are one here, so the GPU-only steps of the rule — the
shards loaded onto the GPU for the LoRA gather, `.cpu()` copies, the copy of an offloaded shard before its
gather, the vLLM worker's two adapter copies — are no-ops or absent; what is compared is the bucket plus what
the rule keeps alive at once: two consecutive full tensors (full fine-tuning), the adapters' host dict (LoRA),
plus the base model gathered on the host (the first LoRA sync, `rollout.load_format: dummy`). The full
fine-tuning case runs with `param_offload` off, where the export is the same on CPU and GPU (no shard copy).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.verl, pytest.mark.slow]

TOLERANCE = 0.15
WORLD = 2
#: 2 MiB: the smallest shared-memory bucket that holds the largest tensor (embeddings, 4096 × 128 fp32).
BUCKET_MB = 2
#: Sizes chosen so that the rules disagree: the MLP's gate/up/down (1.5 MiB each, consecutive) outweigh the
#: embeddings (2 MiB) as a pair, and embed + lm_head (the two largest) are never consecutive.
CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 3072,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
}
#: A profiler range opened by the exporting thread: its allocations are the ones counted.
MARK = "longhaul.sync_export"
#: The GPU spec whose rendered actor settings the LoRA case uses.
SPEC = "prm_lite_lata"


# ---------------------------------------------------------------------------------------------------------
# The measured side (runs in the spawned ranks)


def _is_backend_staging(event) -> bool:
    """An allocation inside the process group's own collective (`c10d::…` ops, gloo's work): gloo stages the
    input and a flat output there; NCCL gathers straight into the caller's tensor, so a GPU sync has no such
    allocation. The gathered tensor itself is allocated by the caller (`_c10d_functional::all_gather_into_tensor`)
    and is counted."""
    parent = event.parent
    while parent is not None:
        if parent.name.startswith(("c10d::", "gloo:")):
            return True
        parent = parent.parent
    return False


def _peak_allocated(prof) -> dict[str, int]:
    """Peak of the bytes allocated during the profile and not yet freed: allocations made on the thread that
    opened `MARK` (the exporting one; gloo's worker threads and the receiver thread are not the trainer's
    export), each free matched to its allocation by address. `allocated` leaves out the collective backend's
    staging (`_is_backend_staging`); `with_backend_staging` keeps it."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int, bool]] = []  # (time, bytes: + allocated / - freed, address, staging)
    roots = prof.profiler.kineto_results.experimental_event_tree()
    (thread,) = {e.start_tid for e in roots if e.name == MARK}
    stack = list(roots)
    while stack:
        e = stack.pop()
        f = e.extra_fields
        if e.tag == _EventType.Allocation and f.device.type == "cpu" and (f.alloc_size < 0 or e.start_tid == thread):
            events.append((e.start_time_ns, f.alloc_size, f.ptr, f.alloc_size > 0 and _is_backend_staging(e)))
        stack.extend(e.children)
    live: dict[int, tuple[int, bool]] = {}
    total = {"allocated": 0, "with_backend_staging": 0}
    peak = dict(total)
    for _, size, ptr, staging in sorted(events):
        if size > 0:
            live[ptr] = (size, staging)
        elif ptr in live:
            freed, staging = live.pop(ptr)
            size = -freed
        else:
            continue  # allocated before the profile or on another thread
        total["with_backend_staging"] += size
        total["allocated"] += 0 if staging else size
        peak = {k: max(peak[k], total[k]) for k in total}
    return peak


def _bucket_module():
    """veRL's bucketed_weight_transfer, loaded from its file: its package `__init__` imports vLLM (not in this
    environment), the module itself only torch, zmq and verl.utils.device (its docstring: no vLLM)."""
    import importlib.util

    import verl

    path = Path(verl.__file__).parent / "workers/rollout/vllm_rollout/bucketed_weight_transfer.py"
    spec = importlib.util.spec_from_file_location("longhaul_test_bucketed_weight_transfer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _send(bwt, weights, socket_dir: str, rank: int, buckets: list[int]) -> None:
    """One `ServerAdapter.update_weights`: veRL's sender into veRL's receiver (a thread), shared-memory bucket."""
    import asyncio
    import threading

    import torch

    create = bwt.create_shared_memory

    def recording(size: int, name: str):
        buckets.append(size)
        return create(size, name)

    bwt.create_shared_memory = recording
    handle = f"ipc://{socket_dir}/sync-{rank}.sock"
    receiver = bwt.BucketedWeightReceiver(zmq_handle=handle, device=torch.device("cpu"), use_shm=True)
    thread = threading.Thread(target=receiver.receive_weights, args=(lambda weights, is_last: None,))
    thread.start()
    sender = bwt.BucketedWeightSender(zmq_handle=handle, bucket_size_mb=BUCKET_MB, use_shm=True)
    asyncio.run(sender.async_send_weights(weights))
    thread.join()
    bwt.create_shared_memory = create


def _engine(model_dir: str, actor: dict):
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    model = HFModelConfig(
        path=model_dir,
        load_tokenizer=False,
        lora_rank=actor["lora_rank"],
        lora_alpha=actor["lora_alpha"],
        target_modules=actor["target_modules"],
        use_remove_padding=False,
        override_config={"attn_implementation": "sdpa"},
    )
    engine = FSDPEngineConfig(
        strategy=actor["strategy"],
        param_offload=actor["param_offload"],
        optimizer_offload=actor["optimizer_offload"],
        use_torch_compile=False,
        dtype="float32",  # the compute dtype (the CPU render's); the export is in the fp32 master dtype either way
    )
    built = FSDPEngineWithLMHead(
        model, engine, FSDPOptimizerConfig(lr=1e-5, total_training_steps=1), CheckpointConfig()
    )
    built.initialize()
    return built


def _measure(engine, bwt, socket_dir: str, rank: int, first_sync: bool) -> dict[str, int]:
    """The sync's sequence in `ActorRolloutRefWorker.update_weights` (naive backend) under the profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    buckets: list[int] = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function(MARK):
            pass
        weights, peft_config = engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
        if peft_config is not None and first_sync:
            base, _ = engine.get_per_tensor_param(layered_summon=False, base_sync_done=False)
            _send(bwt, base, socket_dir, rank, buckets)
            del base
        _send(bwt, weights, socket_dir, rank, buckets)
        del weights
    return {**_peak_allocated(prof), "bucket": max(buckets)}


def _save_model(model_dir: str) -> None:
    """The tiny Qwen2 both ranks' engines load (rank 0 writes it; the engines are built after a barrier)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**CONFIG)).save_pretrained(model_dir)


def _rank(rank: int, port: int, model_dir: str, out_dir: str, actor: dict) -> None:
    import faulthandler
    import tempfile

    import torch.distributed as dist

    faulthandler.dump_traceback_later(500, exit=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    bwt = _bucket_module()
    if rank == 0:  # once veRL is imported (transformers with it): the model costs no import of its own
        _save_model(model_dir)
    dist.barrier()
    with tempfile.TemporaryDirectory(prefix="lh-sync-") as socket_dir:  # ZMQ ipc paths must stay short
        full = _engine(model_dir, {**actor, "lora_rank": 0, "param_offload": False})
        results = {"full": _measure(full, bwt, socket_dir, rank, first_sync=False)}
        del full
        lora = _engine(model_dir, actor)
        results["lora_steady"] = _measure(lora, bwt, socket_dir, rank, first_sync=False)
        results["lora_first"] = _measure(lora, bwt, socket_dir, rank, first_sync=True)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------
# The test


def _rendered_actor() -> dict:
    """The actor settings `render_verl_overrides` gives the GPU spec (strategy, offload, LoRA)."""
    from longhaul.layout import Paths
    from longhaul.render.verl import render_verl_overrides
    from longhaul.spec import load_spec
    from support.specs import SPECS_DIR

    exp = load_spec(SPECS_DIR / f"{SPEC}.yaml")
    pairs = dict(o.split("=", 1) for o in render_verl_overrides(exp, Paths.under("run")) if "=" in o)
    a = "actor_rollout_ref.actor"
    assert pairs[f"{a}.strategy"] == pairs[f"{a}.fsdp_config.strategy"] == "fsdp2"
    assert f"{a}.fsdp_config.model_dtype" not in pairs  # veRL's default: fp32 master weights
    return {
        "strategy": "fsdp2",
        "param_offload": pairs[f"{a}.fsdp_config.param_offload"] == "true",
        "optimizer_offload": pairs[f"{a}.fsdp_config.optimizer_offload"] == "true",
        "lora_rank": exp.spec.policy.lora.rank,
        "lora_alpha": exp.spec.policy.lora.alpha,
        "target_modules": exp.spec.policy.lora.target_modules,
    }


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, dict]:
    from support.ranks import run_ranks

    pytest.importorskip("verl")
    root = tmp_path_factory.mktemp("sync")
    model_dir, out_dir = root / "model", root / "out"
    out_dir.mkdir()
    actor = _rendered_actor()
    env = {**os.environ, "VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [str(model_dir), str(out_dir), json.dumps(actor)]
    run_ranks(Path(__file__), args, world=WORLD, env=env, logs=out_dir, timeout=600)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return actor, model_dir, {case: [r[case] for r in ranks] for case in ranks[0]}


def _estimate(model_dir: Path, actor: dict, *, lora_rank: int, param_offload: bool, base_sync: bool):
    from longhaul.memory.estimate import dtype_bytes
    from longhaul.memory.load import load_model_shape
    from longhaul.memory.plan_layout import VERL_MODEL_DTYPE
    from longhaul.memory.sync import estimate_sync
    from longhaul.spec.serving import ModelRef

    shape = load_model_shape(ModelRef(name="tiny", path=str(model_dir)), field="policy")
    trainable = shape.lora_params(lora_rank, actor["target_modules"])
    master = dtype_bytes(VERL_MODEL_DTYPE)  # the rendered specs keep veRL's fp32 master weights
    return estimate_sync(
        shape,
        world=WORLD,
        lora_rank=lora_rank,
        lora_targets=actor["target_modules"],
        master_size=master,
        shards=(shape.total_params() + trainable) * master // WORLD,
        param_offload=param_offload,
        bucket=BUCKET_MB << 20,
        base_sync=base_sync,
    )


def _close(measured_bytes: int, planned_bytes: int) -> bool:
    return abs(measured_bytes - planned_bytes) <= TOLERANCE * planned_bytes


def _assert_ranks_match(ranks: list[dict], est, planned: int) -> None:
    """Every rank's bucket is the planned one, and what it allocated besides (and with) the bucket is `planned`."""
    for rank in ranks:
        assert rank["bucket"] == est.bucket
        assert _close(rank["allocated"], planned), (rank, planned)
        assert _close(rank["allocated"] + rank["bucket"], est.bucket + planned), (rank, est)


def test_full_weight_export_holds_the_bucket_and_two_consecutive_full_tensors(measured) -> None:
    actor, model_dir, cases = measured
    est = _estimate(model_dir, actor, lora_rank=0, param_offload=False, base_sync=False)
    # Sizes make the alternatives visibly wrong: one tensor at a time would be 2 MiB, the two largest 4 MiB.
    assert est.in_flight == 3 * 2**20  # gate_proj + up_proj (or up + down): 2 × 128 × 3072 × 4 bytes
    _assert_ranks_match(cases["full"], est, est.in_flight)


def test_lora_sync_holds_the_bucket_and_the_adapters_host_copies(measured) -> None:
    actor, model_dir, cases = measured
    assert actor["lora_rank"] > 0 and actor["param_offload"]
    est = _estimate(
        model_dir, actor, lora_rank=actor["lora_rank"], param_offload=actor["param_offload"], base_sync=False
    )
    assert est.host_base == 0 and est.host_adapters > 2**20
    _assert_ranks_match(cases["lora_steady"], est, est.host_adapters)


def test_first_lora_sync_also_gathers_the_base_model_on_the_host(measured) -> None:
    actor, model_dir, cases = measured
    est = _estimate(
        model_dir, actor, lora_rank=actor["lora_rank"], param_offload=actor["param_offload"], base_sync=True
    )
    _assert_ranks_match(cases["lora_first"], est, est.host_adapters + est.host_base)


if __name__ == "__main__":  # one rank (`support.ranks.run_ranks`): RANK PORT MODEL_DIR OUT_DIR ACTOR_JSON
    _rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))
