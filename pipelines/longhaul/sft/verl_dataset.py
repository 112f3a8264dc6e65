"""veRL SFT dataset over longhaul's pre-tokenized Render-Twice-Diff parquet (`data.custom_cls`).

veRL's own `MultiTurnSFTDataset` tokenizes each message separately and concatenates, which is not the same as
rendering the whole conversation; longhaul builds the token ids and the loss mask once (`longhaul sft
build-dataset`) and this class only hands them to veRL's SFT trainer unchanged. It never truncates: a sample
longer than `data.max_length` is an error (the builder already dropped such samples and counted them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

#: Columns written by `longhaul.sft.dataset.write_dataset`.
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"


class RenderTwiceDiffDataset(Dataset):
    """Rows of (input_ids, loss_mask); pad modes `no_padding` (veRL's default) and `right`."""

    def __init__(
        self, parquet_files: str | list[str], tokenizer: Any, config: Any, processor: Any = None, max_samples: int = -1
    ) -> None:
        # deferred: pandas (~0.4 s)
        import pandas as pd

        files = [parquet_files] if isinstance(parquet_files, str) else list(parquet_files)
        frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        if max_samples is not None and 0 < max_samples < len(frame):
            frame = frame.iloc[:max_samples]
        self.input_ids = [list(map(int, x)) for x in frame[INPUT_IDS]]
        self.loss_mask = [list(map(int, x)) for x in frame[LOSS_MASK]]
        self.pad_mode = str(config.get("pad_mode", "no_padding"))
        self.max_length = int(config.get("max_length", 1024))
        self.pad_token_id = (
            tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
        )
        for i, ids in enumerate(self.input_ids):
            if len(ids) != len(self.loss_mask[i]):
                raise ValueError(f"row {i}: input_ids has {len(ids)} tokens but loss_mask {len(self.loss_mask[i])}")
            if len(ids) > self.max_length:
                raise ValueError(
                    f"row {i}: {len(ids)} tokens > data.max_length {self.max_length}; rebuild the "
                    "dataset with the same max_length (samples are dropped there, never truncated)"
                )

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor(self.input_ids[i], dtype=torch.long)
        mask = torch.tensor(self.loss_mask[i], dtype=torch.long)
        pos = torch.arange(len(ids), dtype=torch.long)
        if self.pad_mode == "no_padding":
            return {"input_ids": ids, "position_ids": pos, "loss_mask": mask}
        pad = self.max_length - len(ids)
        return {
            "input_ids": torch.cat([ids, torch.full((pad,), self.pad_token_id, dtype=torch.long)]),
            "attention_mask": torch.cat([torch.ones_like(ids), torch.zeros(pad, dtype=torch.long)]),
            "position_ids": torch.cat([pos, torch.zeros(pad, dtype=torch.long)]),
            "loss_mask": torch.cat([mask, torch.zeros(pad, dtype=torch.long)]),
        }
