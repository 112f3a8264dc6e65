"""SFT stage rendering: the step argv, the veRL SFT overrides (pure), and — marked `verl` — that they compose
with veRL 0.9.1's real `sft_trainer_engine` config, build its config dataclasses, and that veRL's own dataset
factory loads our pre-tokenized parquet through `data.custom_cls`."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from longhaul.layout import Paths, SFTPaths
from longhaul.sft.overrides import render_sft_overrides, render_sft_steps
from longhaul.spec import parse_spec_text

ROOT = Path(__file__).resolve().parents[3]


def _spec(name: str = "lata", **changes):
    doc = yaml.safe_load((ROOT / "specs" / f"{name}.yaml").read_text())
    doc["spec"]["stages"] = ["sft", "grpo", "eval"]
    doc["spec"]["sft"] = {"epochs": 3, "batch_size": 8, "micro_batch_size_per_gpu": 2, "max_length": 12288}
    for path, value in changes.items():
        node = doc
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = copy.deepcopy(value)
    return parse_spec_text(yaml.safe_dump(doc))


def _kv(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def test_steps_in_order_with_sft_model_handed_to_grpo():
    from longhaul.render.verl import policy_model_path

    exp = _spec()
    paths = Paths.under("/runs/r1")
    steps = render_sft_steps(exp, paths)
    assert [s.name for s in steps] == ["collect", "build-dataset", "train", "export"]
    sp = SFTPaths.under(paths)
    assert steps[0].argv[:3] == ("longhaul", "sft", "collect") and sp.trajectories in steps[0].argv
    assert steps[1].argv[3] == sp.trajectories and steps[1].argv[-1] == sp.dataset
    assert steps[2].argv[:6] == (
        "torchrun",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=2",
        "-m",
        "verl.trainer.sft_trainer",
    )
    assert steps[3].argv[-1] == sp.model == policy_model_path(exp, paths)


def test_existing_dataset_skips_collection():
    exp = _spec(spec__sft={"dataset": "data/teacher.jsonl"})
    steps = render_sft_steps(exp, Paths.under("/runs/r1"))
    assert [s.name for s in steps] == ["build-dataset", "train", "export"]
    assert steps[0].argv[3] == "data/teacher.jsonl"


def test_overrides_carry_spec_values():
    exp = _spec()
    kv = _kv(render_sft_overrides(exp, Paths.under("/runs/r1")))
    assert kv["model.lora_rank"] == "16" and kv["model.lora_alpha"] == "32"
    assert kv["trainer.total_epochs"] == "3" and kv["data.max_length"] == "12288"
    assert kv["data.truncation"] == "error"
    assert kv["data.custom_cls.path"] == "'pkg://longhaul.sft.verl_dataset'"
    assert kv["data.train_files"] == "'/runs/r1/sft/dataset.parquet'"
    assert kv["trainer.n_gpus_per_node"] == "2"
    assert "hf_model" in kv["checkpoint.save_contents"]


def test_backend_refusals_name_the_field():
    with pytest.raises(ValueError, match="gpus_per_node is 0"):
        render_sft_steps(_spec("smoke", spec__stages=["sft", "grpo", "eval"]), Paths.under("/r"))
    with pytest.raises(ValueError, match="sft.batch_size"):
        render_sft_overrides(_spec(spec__sft={"batch_size": 6, "micro_batch_size_per_gpu": 2}), Paths.under("/r"))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from longhaul.tiny.models import TinyArch, build_model
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    tok = build_hf_tokenizer(["Hello airline agent. <tool_call> reservation"] * 50, vocab_size=300)
    arch = TinyArch(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
    )
    model = build_model(arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, seed=0)
    out = tmp_path_factory.mktemp("tiny-base")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.verl
def test_overrides_compose_and_build_verl_sft_config(tiny_model_dir, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from support.verl_config import compose_verl

    exp = _spec(spec__policy__model={"name": "longhaul/tiny", "path": str(tiny_model_dir)})
    overrides = render_sft_overrides(exp, Paths.under(str(tmp_path)))
    cfg = compose_verl(overrides, "sft_trainer_engine")
    assert cfg.model.lora_rank == 16 and cfg.data.custom_cls.name == "RenderTwiceDiffDataset"
    assert cfg.trainer.default_local_dir == f"{tmp_path}/sft/checkpoints"
    # The same conversions SFTTrainer._build_config does before touching a GPU.
    model_cfg = omega_conf_to_dataclass(cfg.model)
    assert model_cfg.lora_rank == 16 and model_cfg.tokenizer is not None
    for key in ("engine", "optim", "checkpoint", "profiler"):
        omega_conf_to_dataclass(cfg[key])
    # The FSDP engine computes in the spec's dtype (its `mixed_precision`; bf16 when unset, whatever `dtype` says).
    assert omega_conf_to_dataclass(cfg.engine).mixed_precision["param_dtype"] == str(exp.spec.policy.dtype)
    assert OmegaConf.select(cfg, "optim.lr") == exp.spec.sft.learning_rate


@pytest.mark.verl
def test_verl_dataset_factory_loads_render_twice_diff_parquet(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    from verl.trainer.sft_trainer import create_sft_dataset

    from longhaul.sft.dataset import build_sft_rows, write_dataset
    from support.verl_config import compose_verl

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    record = {
        "task_id": "1",
        "attempt": 0,
        "tools": None,
        "messages": [
            {"role": "system", "content": "Hello airline agent."},
            {"role": "user", "content": "reservation please"},
            {"role": "assistant", "content": "Hello, which reservation?"},
        ],
    }
    rows, dropped, stats = build_sft_rows(tok, [record], max_length=512, min_label_tokens=1)
    assert len(rows) == 1 and not dropped
    path = tmp_path / "sft" / "dataset.parquet"
    write_dataset(rows, path, stats)
    exp = _spec(spec__policy__model={"name": "longhaul/tiny", "path": str(tiny_model_dir)})
    cfg = compose_verl(render_sft_overrides(exp, Paths.under(str(tmp_path))), "sft_trainer_engine")
    ds = create_sft_dataset(cfg.data.train_files, cfg.data, tok, None)
    item = ds[0]
    assert item["input_ids"].tolist() == rows[0]["input_ids"]
    assert item["loss_mask"].tolist() == rows[0]["loss_mask"]
    assert sum(rows[0]["loss_mask"]) == stats.label_tokens > 0
