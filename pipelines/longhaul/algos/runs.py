"""The assistant turns of a batch as a small table (pure torch): one entry per run of 1s in the response mask.

The estimators compute per turn and per row on this table, in float64, and materialise per-token values in one
pass (`paint`); the run table itself costs one comparison and one nonzero over the (bs, T) mask.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class Runs(NamedTuple):
    """The assistant turns of a batch as a small table: one entry per run of 1s in the mask, row-major."""

    row: torch.Tensor  # (R,) row of the run
    k: torch.Tensor  # (R,) index of the run within its row
    start: torch.Tensor  # (R,) first position
    end: torch.Tensor  # (R,) last position (inclusive)
    n_turns: torch.Tensor  # (bs,) runs per row
    L: torch.Tensor  # (bs,) float64 valid tokens per row


def _nonzero_2d(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of the True entries of a 2-D bool tensor, row-major. On CPU numpy's flatnonzero is an order
    of magnitude faster than torch.nonzero for the few-percent-dense transition masks seen here."""
    if x.device.type == "cpu":
        flat = torch.from_numpy(np.flatnonzero(x.contiguous().numpy()))
        w = x.shape[1]
        return flat // w, flat % w
    nz = x.nonzero()
    return nz[:, 0], nz[:, 1]


def build_runs(mask: torch.Tensor) -> Runs:
    """Run table from the mask's 0/1 transitions (one conversion pass, one comparison, one nonzero)."""
    bs, T = mask.shape
    dev = mask.device
    if T == 0:
        e = torch.zeros(0, dtype=torch.long, device=dev)
        return Runs(
            e, e, e, e, torch.zeros(bs, dtype=torch.long, device=dev), torch.zeros(bs, dtype=torch.float64, device=dev)
        )
    m8 = (
        mask
        if mask.dtype in (torch.bool, torch.int8, torch.uint8)
        else (mask != 0).to(torch.int8)
        if mask.is_floating_point()
        else mask.to(torch.int8)
    )
    r_t, p_t = _nonzero_2d(m8[:, 1:] != m8[:, :-1])  # boundary between p and p+1
    rising = m8[r_t, p_t + 1] != 0
    first_on = (m8[:, 0] != 0).nonzero().flatten()
    last_on = (m8[:, -1] != 0).nonzero().flatten()
    s_row = torch.cat([first_on, r_t[rising]])
    s_pos = torch.cat([torch.zeros_like(first_on), p_t[rising] + 1])
    e_row = torch.cat([r_t[~rising], last_on])
    e_pos = torch.cat([p_t[~rising], torch.full_like(last_on, T - 1)])
    s_ord = torch.argsort(s_row * T + s_pos)
    e_ord = torch.argsort(e_row * T + e_pos)
    row, start, end = s_row[s_ord], s_pos[s_ord], e_pos[e_ord]
    n_turns = torch.bincount(row, minlength=bs)
    first = torch.cumsum(n_turns, 0) - n_turns
    k = torch.arange(row.shape[0], device=dev) - first[row]
    L = torch.zeros(bs, dtype=torch.float64, device=dev).index_add_(0, row, (end - start + 1).to(torch.float64))
    return Runs(row, k, start, end, n_turns, L)


def paint(
    values: torch.Tensor, runs: Runs, shape: tuple[int, int], dtype: torch.dtype, fill: float = 0.0
) -> torch.Tensor:
    """Per-run values (R,) spread over their tokens, `fill` elsewhere: one repeat_interleave pass."""
    bs, T = shape
    R = runs.row.shape[0]
    dev = values.device
    prev_end = torch.full((R,), -1, dtype=torch.long, device=dev)
    if R > 1:
        same = runs.row[1:] == runs.row[:-1]
        prev_end[1:] = torch.where(same, runs.end[:-1], prev_end[1:])
    last_end = torch.full((bs,), -1, dtype=torch.long, device=dev).scatter_reduce(0, runs.row, runs.end, "amax")
    n_before = torch.cumsum(runs.n_turns, 0)  # runs in rows <= i
    idx = torch.arange(R, device=dev)
    gap_at = 2 * idx + runs.row
    tail_at = 2 * n_before + torch.arange(bs, device=dev)
    lengths = torch.empty(2 * R + bs, dtype=torch.long, device=dev)
    vals = torch.full((2 * R + bs,), fill, dtype=dtype, device=dev)
    lengths[gap_at] = runs.start - prev_end - 1
    lengths[gap_at + 1] = runs.end - runs.start + 1
    vals[gap_at + 1] = values.to(dtype)
    lengths[tail_at] = T - 1 - last_end
    if dev.type == "cpu":
        return torch.from_numpy(np.repeat(vals.numpy(), lengths.numpy())).view(bs, T)
    return torch.repeat_interleave(vals, lengths, output_size=bs * T).view(bs, T)


def turn_index(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each token: index of its assistant turn (−1 where the mask is 0); per row: number of turns; per token:
    position of the first token of its turn (0 where the mask is 0). (Diagnostics and tests.)"""
    runs = build_runs(response_mask)
    tid = paint(runs.k.to(torch.float64), runs, response_mask.shape, torch.float64, fill=-1.0).long()
    start = paint(runs.start.to(torch.float64), runs, response_mask.shape, torch.float64).long()
    return tid, runs.n_turns, start
