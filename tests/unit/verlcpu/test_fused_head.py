"""Patch 5 (`longhaul.verlcpu.patches.keep_fused_head_in_root`, rule in `longhaul.verlcpu.fused_head`): veRL 0.9.1's
fused log-prob forward on a model with an untied lm_head under FSDP2 — the wiring of the 7B/8B GPU specs.

Two gloo ranks (this file run as a script, once per rank: `support.ranks`), started without VERL_PLATFORM as a GPU
worker is: `import verl` must already have installed the fix through the `verl.plugins` entry point. Each rank
builds a tiny untied Qwen2, applies veRL's own `apply_monkey_patch` (use_fused_kernels, torch backend) and veRL's own
`apply_fsdp2` (fp32 compute, `reshard_after_forward` as veRL's default) and runs a PPO-like loss through the fused
log-probs and entropy:
  * with veRL's wrap selection alone, lm_head is a unit of its own and the forward fails (Tensor/DTensor mix);
  * with the fix, the log-probs and entropy equal the unfused computation on an unsharded copy, and the gradients
    accumulated over two micro-batches and reduce-scattered by FSDP equal the mean over both ranks' batches
    computed on that copy: full fine-tuning (lm_head's own gradient included) with the reduction deferred to the
    last micro-batch, and PEFT LoRA (lm_head frozen, the adapters trained) reduced after each, veRL's default;
  * veRL's own FSDP engine builds the fixed wiring with LoRA and fused kernels, and its fused forward, in bf16 as
    veRL's default mixed precision computes on a GPU, gives the checkpoint's log-probs within bf16's precision
    (the CPU platform is activated after the import, for veRL's device calls).
What a CPU cannot show: bf16 compute, flash-attention's packed layout and CUDA memory (scripts/gpu_check).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = [pytest.mark.verl, pytest.mark.slow]

WORLD = 2
CONFIG = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "max_position_embeddings": 64,
}
#: Sequences per rank and tokens per sequence; the temperature veRL passes to the forward.
BATCH, SEQ, TEMPERATURE = 2, 24, 0.7
#: Largest error relative to the reference's largest magnitude: fp32 on both sides, the fused kernel sums in
#: another order (chunks, its own backward); a gradient missing the other rank's batch is off by ~100 %.
RTOL = 1e-4
#: veRL's engine computes in bf16 (its default mixed precision, the GPU specs' too) beside an fp32 reference:
#: bf16's 8-bit mantissa; a wrong weight is off by ~100 %.
BF16_RTOL = 2e-2


# ---------------------------------------------------------------------------------------------------------
# The ranks (started by the `ranks` fixture)


def _reference(model, body, head, ids, adv):
    """Unfused log-probs and entropy of `ids` (one rank's batch) on the unsharded model, and that rank's loss."""
    import torch

    logits = head(body(input_ids=ids).last_hidden_state).float() / TEMPERATURE
    logp = logits.log_softmax(-1).gather(-1, torch.roll(ids, -1, -1).unsqueeze(-1)).squeeze(-1)
    entropy = torch.logsumexp(logits, -1) - (logits.softmax(-1) * logits).sum(-1)
    return logp, entropy, _loss(logp, entropy, adv)


def _loss(logp, entropy, adv):
    """A policy-gradient term and an entropy bonus: both outputs of the fused kernel carry a gradient."""
    return -(logp * adv).mean() - 0.01 * entropy.mean()


def _shard(model):
    """veRL's FSDP2 wrapping as its engine calls it (`FSDPEngine._build_fsdp_module`), fp32 compute."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from verl.utils import fsdp_utils

    mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=True)
    kwargs = {"mesh": init_device_mesh("cpu", (WORLD,)), "mp_policy": mp, "reshard_after_forward": True}
    fsdp_utils.apply_fsdp2(model, kwargs, {})
    return model


def _error(got, want) -> float:
    """Largest |got - want| relative to the largest |want| (1.0 when `want` is all zeros: nothing is tested)."""
    scale = float(want.abs().max())
    return float((got - want).abs().max()) / scale if scale > 0 else 1.0


def _case(rank: int, model, reference, body, head, ids, adv, *, defer_sync: bool) -> dict:
    """Shard `model` and run rank `rank`'s batch through veRL's fused forward as the engine's gradient accumulation
    does, one sequence per micro-batch (`defer_sync`: gradients reduced only after the last one, veRL's
    `use_no_sync_for_gradient_accumulation`); compare with `reference` (an unsharded copy): outputs against this
    rank's, the accumulated gradients against the mean over both ranks' batches."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    losses = []
    for r in range(WORLD):
        logp, entropy, loss = _reference(reference, body, head, ids[r], adv[r])
        losses.append(loss)
        if r == rank:
            want_logp, want_entropy = logp.detach(), entropy.detach()
    (sum(losses) / WORLD).backward()
    want_grads = {n: p.grad for n, p in reference.named_parameters() if p.requires_grad}
    _shard(model)
    lm_head = model.get_output_embeddings()
    got_logp, got_entropy = [], []
    for mb in range(BATCH):
        last = mb == BATCH - 1
        model.set_requires_gradient_sync(last or not defer_sync)
        out = model(input_ids=ids[rank, mb : mb + 1], return_dict=True, temperature=TEMPERATURE)
        (_loss(out.log_probs, out.entropy, adv[rank, mb : mb + 1]) / BATCH).backward()
        got_logp.append(out.log_probs.detach())
        got_entropy.append(out.entropy.detach())
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.requires_grad}
    return {
        "head_unit_of_its_own": isinstance(lm_head, FSDPModule),
        "layers_sharded": all(isinstance(layer, FSDPModule) for layer in model.get_decoder().layers),
        "logp": _error(torch.cat(got_logp), want_logp),
        "entropy": _error(torch.cat(got_entropy), want_entropy),
        "grad_names": sorted(grads) == sorted(want_grads),
        "grads": {n: _error(g, want_grads[n]) for n, g in grads.items()},
        "head_grad_norm": float(lm_head.weight.grad.full_tensor().norm()) if lm_head.weight.requires_grad else None,
    }


def _engine_case(model_dir: str, ids) -> dict:
    """veRL's own actor engine as a GPU worker builds it for the GPU specs — `FSDPEngineWithLMHead.initialize`:
    the checkpoint loaded, `apply_monkey_patch` (fused kernels), PEFT LoRA, `apply_fsdp2`, the full state loaded
    into the shards — then one fused forward of this rank's batch, beside the unfused log-probs of the checkpoint
    (PEFT starts LoRA's B at zero, so the adapted model computes what the checkpoint does)."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    from transformers import Qwen2ForCausalLM
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    model = HFModelConfig(
        path=model_dir,
        load_tokenizer=False,
        lora_rank=4,
        lora_alpha=8,
        target_modules="all-linear",
        use_remove_padding=False,
        use_fused_kernels=True,
        fused_kernel_options={"impl_backend": "torch"},
        override_config={"attn_implementation": "sdpa"},
    )
    config = FSDPEngineConfig(strategy="fsdp2", param_offload=False, optimizer_offload=False, dtype="float32")
    optim = FSDPOptimizerConfig(lr=1e-5, total_training_steps=1)
    engine = FSDPEngineWithLMHead(model, config, optim, CheckpointConfig())
    engine.initialize()
    out = engine.module(input_ids=ids, return_dict=True, temperature=TEMPERATURE)
    ref = Qwen2ForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    with torch.no_grad():
        want_logp, want_entropy, _ = _reference(ref, ref.model, ref.lm_head, ids, torch.zeros_like(ids))
    return {
        "head_unit_of_its_own": isinstance(engine.module.get_output_embeddings(), FSDPModule),
        "layers_sharded": all(isinstance(layer, FSDPModule) for layer in engine.module.get_decoder().layers),
        "logp": _error(out.log_probs.detach(), want_logp),
        "entropy": _error(out.entropy.detach(), want_entropy),
    }


def _save_checkpoint(out_dir: str) -> None:
    """The engine case's checkpoint (its own seed; each rank seeds its batches afterwards)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    Qwen2ForCausalLM(Qwen2Config(**CONFIG)).save_pretrained(Path(out_dir, "model"))


def _rank(rank: int, port: int, out_dir: str) -> None:
    import copy

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    import verl  # noqa: F401 - loads the verl.plugins entry points, as every veRL worker does
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FSDPModule
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.plugin.platform import PlatformRegistry
    from verl.utils import fsdp_utils

    from longhaul.verlcpu import plugin

    result: dict = {
        "installed": getattr(fsdp_utils._select_fsdp2_wrap_targets, "longhaul_fused_head", False),
        "cpu_platform_at_import": "cpu" in PlatformRegistry.registered_names(),
    }
    if rank == 0:  # the engine case's checkpoint, once the findings of the import (the first thing) are read
        _save_checkpoint(out_dir)
    dist.barrier()
    # then the CPU platform, before veRL resolves its platform: the engine case's device calls need one here
    os.environ["VERL_PLATFORM"] = "cpu"
    plugin.activate()
    torch.manual_seed(0)  # the same weights and batches on both ranks; each rank takes its own batch
    base = Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="sdpa"))
    ids = torch.randint(0, CONFIG["vocab_size"], (WORLD, BATCH, SEQ))
    adv = torch.randn(WORLD, BATCH, SEQ)
    lora = copy.deepcopy(base)
    lora.enable_input_require_grads()  # as veRL's `_build_lora_module`; B not zero, so A gets a gradient too
    lora = get_peft_model(lora, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    lora_ref = copy.deepcopy(lora)
    full_ref = copy.deepcopy(base)
    # veRL's fused forward replaces the class's forward: the references only call the body and lm_head
    apply_monkey_patch(base, use_remove_padding=False, use_fused_kernels=True, fused_kernels_backend="torch")

    fixed = fsdp_utils._select_fsdp2_wrap_targets
    fsdp_utils._select_fsdp2_wrap_targets = getattr(fixed, "__wrapped__", fixed)  # veRL's selection alone
    try:
        unfixed = _shard(copy.deepcopy(base))
    finally:
        fsdp_utils._select_fsdp2_wrap_targets = fixed
    result["unpatched"] = {"head_unit_of_its_own": isinstance(unfixed.lm_head, FSDPModule), "error": None}
    try:
        unfixed(input_ids=ids[rank], return_dict=True, temperature=TEMPERATURE)
    except RuntimeError as exc:
        result["unpatched"]["error"] = str(exc).splitlines()[0]

    # full fine-tuning with deferred gradient sync; LoRA as the GPU specs run it (veRL's config: sync each time)
    result["full"] = _case(rank, base, full_ref, full_ref.model, full_ref.lm_head, ids, adv, defer_sync=True)
    body = lora_ref.get_base_model()
    result["lora"] = _case(rank, lora, lora_ref, body.model, body.lm_head, ids, adv, defer_sync=False)
    result["engine"] = _engine_case(str(Path(out_dir, "model")), ids[rank])
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both ranks' results; the ranks run as a GPU worker's process would (no VERL_PLATFORM)."""
    from support.ranks import run_ranks

    pytest.importorskip("verl")
    out = tmp_path_factory.mktemp("fused-head")
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    run_ranks(Path(__file__), [str(out)], world=WORLD, env=env, logs=out, timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_import_verl_installs_the_fix_without_the_cpu_platform(ranks: list[dict]) -> None:
    assert all(r["installed"] and not r["cpu_platform_at_import"] for r in ranks)


def test_verl_alone_fails_on_the_sharded_head(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["unpatched"]["head_unit_of_its_own"] is True
        assert "mixed torch.Tensor and DTensor" in (r["unpatched"]["error"] or ""), r["unpatched"]


@pytest.mark.parametrize("case", ["full", "lora"])
def test_fixed_wiring_matches_the_unsharded_model(ranks: list[dict], case: str) -> None:
    for r in ranks:
        got = r[case]
        assert got["head_unit_of_its_own"] is False and got["layers_sharded"] is True
        assert got["logp"] <= RTOL and got["entropy"] <= RTOL, got
        assert got["grad_names"] and got["grads"], got
        outside = {n: e for n, e in got["grads"].items() if e > RTOL}
        assert not outside, outside
    if case == "full":  # lm_head's own gradient reached its shards
        assert ranks[0]["full"]["head_grad_norm"] > 0 and "lm_head.weight" in ranks[0]["full"]["grads"]
    else:  # LoRA: lm_head frozen, only the adapters trained
        assert ranks[0]["lora"]["head_grad_norm"] is None
        assert all("lora_" in n for n in ranks[0]["lora"]["grads"])


def test_veRLs_engine_builds_the_fixed_wiring(ranks: list[dict]) -> None:
    """The fix reaches `apply_fsdp2` as veRL's FSDP engine calls it, with LoRA and fused kernels as rendered."""
    for r in ranks:
        got = r["engine"]
        assert got["head_unit_of_its_own"] is False and got["layers_sharded"] is True
        assert got["logp"] <= BF16_RTOL and got["entropy"] <= BF16_RTOL, got


# ---------------------------------------------------------------------------------------------------------
# The rule and the guard, in this process


def _tiny(tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**{**CONFIG, "tie_word_embeddings": tied}))


def test_only_the_defective_case_changes_veRLs_selection() -> None:
    """Untied head + veRL's fused forward: lm_head leaves the separate units (embed_tokens and the layers stay);
    a tied head or the unfused forward: veRL's selection unchanged."""
    from verl.utils import fsdp_utils

    from longhaul.verlcpu import patches

    select = fsdp_utils._select_fsdp2_wrap_targets
    assert select.longhaul_fused_head is True
    original = select.__wrapped__
    untied = _tiny(tied=False)
    layers = ["Qwen2DecoderLayer"]
    assert not patches.uses_verl_fused_forward(untied)
    assert select(untied, layers) == original(untied, layers)
    assert untied.lm_head in original(untied, layers)

    class Fused(type(untied)):  # what apply_monkey_patch does to the class, without touching Qwen2's
        pass

    from verl.models.transformers.dense_common import forward_with_torch_backend, forward_with_triton_backend

    for forward in (forward_with_torch_backend, forward_with_triton_backend):
        Fused.forward = forward
        untied.__class__ = Fused
        assert patches.uses_verl_fused_forward(untied)
        assert select(untied, layers) == [m for m in original(untied, layers) if m is not untied.lm_head]
        assert untied.model.embed_tokens in select(untied, layers)
    tied = _tiny(tied=True)
    tied.__class__ = type("FusedTied", (type(tied),), {"forward": forward_with_torch_backend})
    assert select(tied, layers) == original(tied, layers)


def test_the_rule_finds_a_nested_head() -> None:
    """PEFT nests the causal LM (`base_model.model.lm_head`): the rule matches the name at any depth."""
    from torch import nn

    from longhaul.verlcpu.fused_head import keep_output_layer_in_root

    head, embed = nn.Linear(4, 8), nn.Embedding(8, 4)
    inner = nn.Module()
    inner.lm_head, inner.embed_tokens = head, embed
    outer = nn.Module()
    outer.model = inner
    outer.config = SimpleNamespace(tie_word_embeddings=False)
    assert keep_output_layer_in_root(outer, [embed, head], fused_forward=True) == [embed]
    assert keep_output_layer_in_root(outer, [embed, head], fused_forward=False) == [embed, head]


def test_the_fix_refuses_a_changed_verl(monkeypatch) -> None:
    """Patch 5 checks veRL's version, the wrap selection, its call in apply_fsdp2 and the fused forwards' read."""
    import inspect

    import verl
    from verl.utils import fsdp_utils

    from longhaul.verlcpu import patches

    patches.check_fused_head_wiring(fsdp_utils)  # the pinned veRL passes
    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(patches.VeRLChanged, match="0.9.1"):
        patches.keep_fused_head_in_root(SimpleNamespace(_select_fsdp2_wrap_targets=lambda *a: []))
    monkeypatch.setattr(verl, "__version__", "0.9.1")
    changed = SimpleNamespace(_select_fsdp2_wrap_targets=_tiny, apply_fsdp2=_tiny)
    with pytest.raises(patches.VeRLChanged, match="_select_fsdp2_wrap_targets no longer wraps"):
        patches.check_fused_head_wiring(changed)
    real_getsource = inspect.getsource
    monkeypatch.setattr(
        inspect, "getsource", lambda obj: real_getsource(fsdp_utils._select_fsdp2_wrap_targets.__wrapped__)
    )
    with pytest.raises(patches.VeRLChanged, match="apply_fsdp2 no longer calls"):
        patches.check_fused_head_wiring(fsdp_utils)
    monkeypatch.setattr(inspect, "getsource", real_getsource)
    monkeypatch.setattr(patches, "_DENSE_FORWARDS", "models/transformers/missing.py")
    with pytest.raises(patches.VeRLChanged, match="fused forwards"):
        patches.check_fused_head_wiring(fsdp_utils)


if __name__ == "__main__":  # one rank (`support.ranks.run_ranks`): RANK PORT OUT_DIR
    _rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
