"""veRL's checkpoint layout and the merge into a servable Hugging Face model (`longhaul.checkpoints`).

The rules of a complete step are checked on hand-made layouts (fast). The merge is checked on REAL checkpoints
written by veRL's own `FSDPCheckpointManager` on an FSDP2-wrapped tiny Qwen2 in a one-process gloo group (what
veRL's FSDP engine does in `save_checkpoint`), in both layouts: `main_ppo`'s `global_step_N/actor/` (full
fine-tuning) and the SFT trainer's `global_step_N/` with LoRA (through `longhaul.sft.export`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from longhaul.checkpoints import (
    MERGE_RECORD,
    TRACKER_FILE,
    CheckpointError,
    MergeAborted,
    file_whole,
    latest_step,
    merge_checkpoint,
    merge_lora_adapter,
    merged_model_dir,
    prepare_resume,
    saved_steps,
    shard_dir,
    step_dir,
)

# --------------------------------------------------------------------------------------------------------------
# The rules, on hand-made layouts


def _archive(path: Path, payload: bytes = b"tensor data" * 50) -> None:
    """A small zip archive, torch.save's format (its central directory at the end)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", payload)


def _fake_step(
    root: Path, step: int, *, world_size: int = 2, missing_rank: int | None = None, component: str | None = "actor"
) -> Path:
    d = shard_dir(root, step, component)
    (d / "huggingface").mkdir(parents=True)
    (d / "huggingface" / "config.json").write_text("{}")
    (d / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    for r in range(world_size):
        if r != missing_rank:
            for kind in ("model", "optim", "extra_state"):
                _archive(d / f"{kind}_world_size_{world_size}_rank_{r}.pt")
    if component:
        _archive(step_dir(root, step) / "data.pt")
    return d


def _track(root: Path, step: int | str) -> None:
    (root / TRACKER_FILE).write_text(f"{step}")


def test_saved_steps_lists_only_complete_steps_up_to_the_tracker(tmp_path):
    assert saved_steps(tmp_path / "absent") == [] and latest_step(tmp_path / "absent") is None
    for s in (1, 3, 4, 6):
        _fake_step(tmp_path, s)
    assert saved_steps(tmp_path) == []  # no tracker: veRL finished no save
    _track(tmp_path, 4)
    assert saved_steps(tmp_path) == [1, 3, 4] and latest_step(tmp_path) == 4  # 6: newer than the tracker

    _fake_step(tmp_path, 2, missing_rank=1)  # a rank's shard missing
    (shard_dir(tmp_path, 3) / "model_world_size_2_rank_0.pt").write_bytes(b"")  # an empty shard
    shutil.rmtree(shard_dir(tmp_path, 1))  # retention removed actor/, global_step_1/ stays
    (tmp_path / "global_step_x").mkdir()
    (tmp_path / ".global_step_5.tmp").mkdir()
    assert saved_steps(tmp_path) == [4]

    (shard_dir(tmp_path, 4) / "fsdp_config.json").write_text("{")  # half-written config
    assert saved_steps(tmp_path) == [] and latest_step(tmp_path) is None


def test_a_file_cut_at_any_byte_is_not_whole(tmp_path):
    f = tmp_path / "model.pt"
    _archive(f)
    data = f.read_bytes()
    assert file_whole(f)
    for cut in range(len(data)):  # every prefix of a zip archive, the empty one included
        f.write_bytes(data[:cut])
        assert not file_whole(f), cut
    f.write_bytes(b"\x80\x02legacy pickle")  # torch's legacy format: only non-empty can be checked
    assert file_whole(f)
    assert not file_whole(tmp_path / "absent.pt")


@pytest.mark.parametrize("damage", ["optim", "extra_state", "data.pt", "hf_config", "truncate_model", "optim_rank"])
def test_every_file_a_resume_reads_is_required(tmp_path, damage):
    _fake_step(tmp_path, 1)
    _fake_step(tmp_path, 2)
    _track(tmp_path, 2)
    d = shard_dir(tmp_path, 2)
    if damage in ("optim", "extra_state"):  # absent for every rank: veRL's resume would fail to load it
        for r in range(2):
            (d / f"{damage}_world_size_2_rank_{r}.pt").unlink()
    elif damage == "optim_rank":  # one rank's optimizer shard missing: a save cut short
        (d / "optim_world_size_2_rank_1.pt").unlink()
    elif damage == "data.pt":
        (step_dir(tmp_path, 2) / "data.pt").unlink()
    elif damage == "hf_config":
        (d / "huggingface" / "config.json").write_text('{"archi')
    else:
        f = d / "model_world_size_2_rank_1.pt"
        f.write_bytes(f.read_bytes()[:-10])
    assert saved_steps(tmp_path) == [1]


def test_prepare_resume_points_the_tracker_at_the_newest_complete_step(tmp_path):
    assert prepare_resume(tmp_path / "absent").step is None
    for s in (1, 2):
        _fake_step(tmp_path, s)
    _track(tmp_path, 2)
    assert prepare_resume(tmp_path) == prepare_resume(tmp_path).__class__(2, "2", ())  # nothing to do

    # A save of step 3 cut short: removed, the tracker is kept.
    _fake_step(tmp_path, 3, missing_rank=1)
    point = prepare_resume(tmp_path)
    assert point.step == 2 and not step_dir(tmp_path, 3).exists()
    assert point.changes == (
        "removed global_step_3: a save cut short (not recorded in latest_checkpointed_iteration.txt, files not whole)",
    )

    # The tracker cut short by a kill (veRL's open("w") truncates first): the newest whole step.
    _track(tmp_path, "")
    point = prepare_resume(tmp_path)
    assert point.step == 2 and (tmp_path / TRACKER_FILE).read_text() == "2" and point.tracker_before == ""

    # Whole but never recorded (killed between data.pt and the tracker): kept aside, not resumed from.
    _fake_step(tmp_path, 3)
    point = prepare_resume(tmp_path)
    assert point.step == 2 and (tmp_path / "global_step_3.incomplete" / "data.pt").is_file()
    assert saved_steps(tmp_path) == [1, 2]

    # Recorded but damaged afterwards: renamed aside, the tracker falls back to the step before.
    (shard_dir(tmp_path, 2) / "model_world_size_2_rank_0.pt").write_bytes(b"PK\x03\x04cut")
    point = prepare_resume(tmp_path)
    assert point.step == 1 and (tmp_path / TRACKER_FILE).read_text() == "1"
    assert (tmp_path / "global_step_2.incomplete").is_dir() and not step_dir(tmp_path, 2).exists()


def test_prepare_resume_refuses_a_tracker_with_no_complete_step(tmp_path):
    _fake_step(tmp_path, 1, missing_rank=0)
    _track(tmp_path, 1)
    with pytest.raises(CheckpointError, match="holds '1' but no complete checkpoint exists up to that step"):
        prepare_resume(tmp_path)
    assert step_dir(tmp_path, 1).is_dir() and (tmp_path / TRACKER_FILE).read_text() == "1"  # nothing touched
    # No tracker: veRL trains from scratch; debris of its first save cut short is cleared.
    (tmp_path / TRACKER_FILE).unlink()
    point = prepare_resume(tmp_path)
    assert point.step is None and not step_dir(tmp_path, 1).exists()


def test_tracker_pointing_at_a_missing_step(tmp_path):
    for s in (1, 2):
        _fake_step(tmp_path, s, world_size=1)
    _track(tmp_path, 3)
    assert saved_steps(tmp_path) == [1, 2] and latest_step(tmp_path) == 2
    _track(tmp_path, "")
    with pytest.raises(ValueError, match=f"{TRACKER_FILE}: expected a step number"):
        saved_steps(tmp_path)


def test_sft_layout_has_no_actor_subdir(tmp_path):
    _fake_step(tmp_path, 7, component=None)
    _track(tmp_path, 7)
    assert saved_steps(tmp_path) == [] and saved_steps(tmp_path, component=None) == [7]
    # Only exported (never resumed by longhaul): the model's shards suffice; others all or none.
    for r in range(2):
        (step_dir(tmp_path, 7) / f"optim_world_size_2_rank_{r}.pt").unlink()
    assert saved_steps(tmp_path, component=None) == [7]
    (step_dir(tmp_path, 7) / "extra_state_world_size_2_rank_1.pt").unlink()
    assert saved_steps(tmp_path, component=None) == []


def test_merge_refuses_an_incomplete_step(tmp_path):
    _fake_step(tmp_path / "ck", 1, missing_rank=0)
    _track(tmp_path / "ck", 1)
    out = merged_model_dir(tmp_path, 1)
    with pytest.raises(FileNotFoundError, match="step 1 is not a complete veRL checkpoint"):
        merge_checkpoint(tmp_path / "ck", 1, out, base_model=None)
    assert not out.exists()


def test_merge_stops_on_request_and_leaves_nothing(tmp_path):
    _fake_step(tmp_path / "ck", 1, world_size=1)
    _track(tmp_path / "ck", 1)
    out = merged_model_dir(tmp_path, 1)
    with pytest.raises(MergeAborted):
        merge_checkpoint(tmp_path / "ck", 1, out, base_model=None, abort=lambda: True)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


@pytest.mark.slow
def test_merge_lora_adapter_equals_adapter_model(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    tok = _tiny_tokenizer()
    base = _tiny_model(tok)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    torch.manual_seed(1)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([tok("a reservation", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "base")(input_ids=ids).logits
    assert not torch.allclose(expected, plain, atol=1e-4)  # the adapter does change the model

    merge_lora_adapter(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-4)
    assert (tmp_path / "merged" / "tokenizer.json").exists()


# --------------------------------------------------------------------------------------------------------------
# Real veRL checkpoints

TEXT = "a reservation for the airline agent"

#: Runs in a fresh interpreter (a process group and veRL's platform stay out of the test process). For each
#: layout: wraps the tiny model with veRL's `apply_fsdp2`, takes one optimizer step so the weights differ from
#: the base, saves with veRL's `FSDPCheckpointManager` (and `data.pt`, as main_ppo does), writes veRL's tracker
#: file, dumps the full state dict.
WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist

    root, base, text = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{root}/.pg", rank=0, world_size=1)
    from omegaconf import OmegaConf
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.fsdp_utils import apply_fsdp2, fsdp2_load_full_state_dict

    tok = AutoTokenizer.from_pretrained(base)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    contents = OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                                 "load_contents": ["model", "optimizer", "extra"]})
    for layout, step, sub in (("ppo", 1, "actor"), ("sft_lora", 2, "")):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        if layout == "sft_lora":
            torch.manual_seed(1)
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                     init_lora_weights=False))
        full = model.state_dict()
        apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32),
                            "offload_policy": None, "reshard_after_forward": True}, OmegaConf.create({}))
        fsdp2_load_full_state_dict(model, full, mesh, None)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        ids = torch.tensor([tok(text)["input_ids"]])
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        mgr = FSDPCheckpointManager(model, opt, None, processing_class=tok, checkpoint_config=contents)
        ck = root / layout / "checkpoints"
        mgr.save_checkpoint(local_path=str(ck / f"global_step_{step}" / sub), global_step=step)
        if sub:  # main_ppo saves the dataloader state after the actor's files, before the tracker
            torch.save({"step": step}, ck / f"global_step_{step}" / "data.pt")
        Path(get_checkpoint_tracker_filename(str(ck))).write_text(str(step))
        torch.save({k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
                    for k, v in model.state_dict().items()}, root / layout / "expected.pt")
    dist.destroy_process_group()
""")


def _tiny_tokenizer():
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    return build_hf_tokenizer([TEXT] * 20, vocab_size=300)


def _tiny_model(tok):
    from longhaul.tiny.models import TinyArch, build_model

    arch = TinyArch(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
    )
    return build_model(arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, seed=0)


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, Path]:
    """Real veRL checkpoints: `ppo` (global_step_1/actor, full weights) and `sft_lora` (global_step_2, LoRA)."""
    pytest.importorskip("verl")
    from longhaul.verlcpu import cpu_job_env

    root = tmp_path_factory.mktemp("verl_ckpt")
    tok = _tiny_tokenizer()
    _tiny_model(tok).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    res = subprocess.run(
        [sys.executable, "-c", WRITER, str(root), str(root / "base"), TEXT],
        env={**os.environ, **cpu_job_env()},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return {"base": root / "base", "ppo": root / "ppo", "sft_lora": root / "sft_lora"}


def _bf16_equal(a, b) -> bool:
    import torch

    return a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))


@pytest.mark.slow
@pytest.mark.verl
def test_real_checkpoint_is_found_and_damaged_copies_are_not(real, tmp_path):
    ck = tmp_path / "checkpoints"
    shutil.copytree(real["ppo"] / "checkpoints", ck)
    assert (ck / TRACKER_FILE).read_text() == "1"  # written at veRL's tracker path
    assert saved_steps(ck) == [1] and latest_step(ck) == 1
    assert saved_steps(real["sft_lora"] / "checkpoints", component=None) == [2]

    shutil.copytree(ck / "global_step_1", ck / "global_step_2")
    assert saved_steps(ck) == [1]  # not yet in the tracker: a save in progress
    _track(ck, 2)
    assert saved_steps(ck) == [1, 2] and latest_step(ck) == 2
    (shard_dir(ck, 2) / "model_world_size_1_rank_0.pt").unlink()
    assert saved_steps(ck) == [1] and latest_step(ck) == 1
    _track(ck, 3)  # the tracker names a step that is not there
    assert saved_steps(ck) == [1]


@pytest.mark.slow
@pytest.mark.verl
def test_merge_real_checkpoint(real, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ck = real["ppo"] / "checkpoints"
    out = merged_model_dir(tmp_path / "run", 1)
    # An interrupted merge left its temporary directory and nothing at the target: the merge is redone from
    # scratch. (Left before the test's one real merge: each run of veRL's merger imports veRL anew, 10-20 s of CPU.)
    debris = out.with_name(f".{out.name}.merging")
    (debris / "fsdp").mkdir(parents=True)
    (debris / "fsdp" / "model.safetensors").write_bytes(b"half")
    assert merge_checkpoint(ck, 1, out, base_model=real["base"]) == out
    assert not debris.exists()

    saved = torch.load(real["ppo"] / "expected.pt")
    base = AutoModelForCausalLM.from_pretrained(real["base"]).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype="auto").state_dict()
    assert merged.keys() <= saved.keys() and "model.embed_tokens.weight" in merged
    # veRL's merger writes bfloat16: the merged weights are the saved ones, rounded to bfloat16
    assert all(_bf16_equal(merged[k], saved[k]) for k in merged), [
        k for k in merged if not _bf16_equal(merged[k], saved[k])
    ]
    assert not torch.allclose(
        merged["model.layers.0.mlp.up_proj.weight"].float(), base["model.layers.0.mlp.up_proj.weight"], atol=1e-3
    )  # trained, not the base
    tok, base_tok = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(real["base"])
    assert tok(TEXT)["input_ids"] == base_tok(TEXT)["input_ids"] and tok.chat_template == base_tok.chat_template
    assert json.loads((out / MERGE_RECORD).read_text())["lora_merged"] is False
    assert sorted(p.name for p in out.parent.iterdir()) == ["global_step_1"]  # no temporary directory left

    # A second merge is a no-op: veRL's merger is not run again.
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("merged again"))
    assert merge_checkpoint(ck, 1, out, base_model=real["base"]) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    monkeypatch.undo()


@pytest.mark.slow
@pytest.mark.verl
def test_failed_merge_leaves_nothing(real, tmp_path):
    ck = tmp_path / "checkpoints"
    shutil.copytree(real["ppo"] / "checkpoints", ck)
    (shard_dir(ck, 1) / "model_world_size_1_rank_0.pt").write_bytes(b"not a torch file")
    out = merged_model_dir(tmp_path / "run", 1)
    with pytest.raises(RuntimeError, match="veRL's model merger failed"):
        merge_checkpoint(ck, 1, out, base_model=real["base"])
    assert list(out.parent.iterdir()) == []


@pytest.mark.slow
@pytest.mark.verl
def test_export_real_sft_lora_checkpoint(real, tmp_path):
    """`longhaul sft export` on a real SFT-layout LoRA checkpoint: the adapter is merged into the base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from longhaul.sft.export import export_sft_model

    out = tmp_path / "sft" / "model"
    assert export_sft_model(real["sft_lora"] / "checkpoints", str(real["base"]), out) == 2
    merged = AutoModelForCausalLM.from_pretrained(out, dtype="auto").state_dict()
    assert not any("lora" in k for k in merged)
    saved = torch.load(real["sft_lora"] / "expected.pt")
    prefix, scale = "base_model.model.", 8 / 4  # lora_alpha / r
    targets = 0
    for k, w in merged.items():
        module = k.rsplit(".", 1)[0]
        lora_a = saved.get(f"{prefix}{module}.lora_A.default.weight")
        if lora_a is None:  # not a LoRA target: the saved weight, in bfloat16
            assert _bf16_equal(w, saved[prefix + k]), k
            continue
        base_w = saved[f"{prefix}{module}.base_layer.{k.rsplit('.', 1)[1]}"]
        if k.endswith(".bias"):
            assert _bf16_equal(w, base_w), k
            continue
        targets += 1
        want = base_w + scale * saved[f"{prefix}{module}.lora_B.default.weight"] @ lora_a
        assert torch.allclose(w.float(), want, rtol=1e-2, atol=1e-2), k
        assert not torch.allclose(w.float(), base_w, rtol=1e-2, atol=1e-2), k  # the adapter was applied
    assert targets == 7  # q, k, v, o, gate, up, down of the one layer
    assert json.loads((out / MERGE_RECORD).read_text())["lora_merged"] is True
    assert (
        AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"]
        == AutoTokenizer.from_pretrained(real["base"])(TEXT)["input_ids"]
    )
    assert sorted(p.name for p in out.parent.iterdir()) == ["model"]
