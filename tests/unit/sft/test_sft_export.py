"""SFT export helpers: the newest checkpoint step, and merging a LoRA adapter into its base (what the GRPO stage
loads). The veRL FSDP gathering itself (`verl.model_merger`) needs a real SFT checkpoint (GPU run)."""

from __future__ import annotations

import pytest

from longhaul.sft.export import latest_step, merge_lora_adapter


def test_latest_step(tmp_path):
    with pytest.raises(FileNotFoundError, match="no global_step_N"):
        latest_step(tmp_path)
    for n in (5, 40, 12):
        (tmp_path / f"global_step_{n}").mkdir()
    assert latest_step(tmp_path) == 40
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12\n")
    assert latest_step(tmp_path) == 12


def test_merge_lora_adapter_equals_adapter_model(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from longhaul.tiny.models import TinyArch, build_model
    from longhaul.tiny.tokenizer import build_hf_tokenizer

    tok = build_hf_tokenizer(["a reservation for the airline agent"] * 20, vocab_size=300)
    arch = TinyArch(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=512)
    base = build_model(arch, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, seed=0)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    torch.manual_seed(1)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                 init_lora_weights=False))
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
