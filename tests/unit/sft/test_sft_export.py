"""SFT export: the newest complete step of veRL's SFT layout (shards in `global_step_N/`, no `actor/`) goes
through `longhaul.checkpoints.merge_checkpoint`. The merge itself, on a real veRL SFT LoRA checkpoint, is tested
in tests/unit/test_checkpoints.py (`test_export_real_sft_lora_checkpoint`)."""

from __future__ import annotations

import json

import pytest

from longhaul.checkpoints import TRACKER_FILE
from longhaul.sft import export


def _sft_step(root, step, *, complete=True):
    d = root / f"global_step_{step}"
    (d / "huggingface").mkdir(parents=True)
    (d / "huggingface" / "config.json").write_text("{}")
    (d / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    if complete:
        (d / "model_world_size_1_rank_0.pt").write_bytes(b"shard")


def test_export_merges_the_latest_complete_step(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(export, "merge_checkpoint", lambda *a, **k: calls.append((a, k)))
    with pytest.raises(FileNotFoundError, match="no complete global_step_N"):
        export.export_sft_model(tmp_path, "base", tmp_path / "out")
    for n in (5, 12):
        _sft_step(tmp_path, n)
    _sft_step(tmp_path, 40, complete=False)
    (tmp_path / TRACKER_FILE).write_text("40")
    assert export.export_sft_model(tmp_path, "base", tmp_path / "out") == 12
    assert calls == [((tmp_path, 12, tmp_path / "out", "base"), {"component": None})]
