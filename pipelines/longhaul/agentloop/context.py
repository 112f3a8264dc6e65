"""Where a trajectory sits in training: step, prompt group, session, and the user-simulator seed derived from them.

veRL's v1 agent-loop worker (`AgentLoopWorkerTQ._run_prompt`) calls the loop's `run` with the dataset row's fields
plus `global_steps` (the trainer step that fetched the prompt), `uid` (one per prompt group), `index` (the row's
`extra_info.index`) and `session_id` (0..n-1 within the group). Validation is not among them: longhaul's val rows
carry `extra_info.validate: true` (`longhaul.agentloop.dataset`). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def derive_rollout_seed(base_seed: int | None, *, step: int | None, index: int, session: int, validate: bool) -> int:
    """A reproducible user-simulator seed for one trajectory, distinct per (step, prompt, session).

    Training seeds change with the step (a task seen again later meets a differently sampled customer); validation
    seeds leave the step out, so every checkpoint is validated against the same simulated customers (a paired
    comparison). The value fits in 31 bits (vLLM and OpenAI accept it as `seed`).
    """
    parts = ["val" if validate else "train", str(0 if base_seed is None else int(base_seed)), str(index), str(session)]
    if not validate:
        parts.append(str(-1 if step is None else int(step)))
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def _scalar(x: Any) -> Any:
    """Plain Python value of a numpy / torch 0-d value (veRL hands row fields over as those)."""
    return x.item() if hasattr(x, "item") and callable(x.item) else x


@dataclass(frozen=True)
class RolloutContext:
    """Identity of one trajectory inside a training (or validation) step."""

    step: int | None  # trainer step that dispatched the prompt (None outside veRL's v1 worker)
    validate: bool
    index: int  # prompt group: the dataset row's extra_info.index
    session: int  # sample within the group: 0..n-1
    uid: str | None  # veRL's id of the prompt group
    seed: int  # user-simulator seed

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RolloutContext:
        extra = row.get("extra_info") or {}
        step = _scalar(row.get("global_steps"))
        index = _scalar(row.get("index", extra.get("index", 0)))
        session = _scalar(row.get("session_id", 0))
        validate = bool(_scalar(row.get("validate", extra.get("validate", False))))
        uid = _scalar(row.get("uid"))
        step = None if step is None else int(step)
        index, session = int(index or 0), int(session or 0)
        seed = derive_rollout_seed(extra.get("seed"), step=step, index=index, session=session, validate=validate)
        return cls(
            step=step, validate=validate, index=index, session=session, uid=None if uid is None else str(uid), seed=seed
        )

    def weights_version_floor(self) -> int:
        """The policy version a trajectory of this step is generated with when no generation reports one: the sync
        trainer updates the rollout weights at the end of every step, so step N's rollouts run version N-1 and the
        validation that follows step N runs version N (veRL counts versions in trainer steps, from 0)."""
        if self.step is None:
            return 0
        return max(0, self.step if self.validate else self.step - 1)
