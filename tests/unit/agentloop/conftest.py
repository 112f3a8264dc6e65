"""Fixtures for the agent-loop tests: the scripted OpenAI-compatible server and an in-memory TransferQueue.

`fake_tq` stands in for the few TransferQueue calls veRL's v1 agent-loop worker (`agent_loop_tq`) and replay
buffer (`replay_buffer`) make (put tags/fields, list tags, clear keys), so veRL's own worker and sampler code runs
without Ray. Tags merge on update, as TransferQueue documents ("will only update the newly given tag").
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from support.openai_stub import openai_stub  # noqa: F401  (the scripted OpenAI-compatible server fixture)


class FakeTQ:
    def __init__(self) -> None:
        self.tags: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.fields: dict[str, dict[str, Any]] = defaultdict(dict)  # partition -> key -> {field: value}

    # writes
    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: dict | None = None) -> None:
        self.tags[partition_id].setdefault(key, {}).update(tag or {})
        if fields is not None:
            self.fields[partition_id][key] = fields

    def kv_batch_put(
        self, keys: list[str], partition_id: str, fields: Any = None, tags: list[dict] | None = None
    ) -> None:
        for i, key in enumerate(keys):
            self.tags[partition_id].setdefault(key, {}).update((tags or [{}] * len(keys))[i])
            if fields is not None:
                self.fields[partition_id][key] = {name: fields[name][i] for name in fields.keys()}

    async def async_kv_put(self, **kw: Any) -> None:
        self.kv_put(**kw)

    async def async_kv_batch_put(self, **kw: Any) -> None:
        self.kv_batch_put(**kw)

    # reads
    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        return {p: {k: dict(t) for k, t in tags.items()} for p, tags in self.tags.items() if partition_id in (None, p)}

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.tags[partition_id].pop(key, None)
            self.fields[partition_id].pop(key, None)

    # test helpers
    def status(self, uid: str, partition_id: str = "train") -> str:
        return self.tags[partition_id][uid]["status"]

    def trajectories(self, partition_id: str = "train") -> dict[str, dict[str, Any]]:
        return {k: t for k, t in self.tags[partition_id].items() if not t.get("is_prompt") and "_" in k}


@pytest.fixture
def fake_tq(monkeypatch: pytest.MonkeyPatch) -> FakeTQ:
    from verl.trainer.ppo.v1 import agent_loop_tq, replay_buffer

    tq = FakeTQ()
    monkeypatch.setattr(agent_loop_tq, "tq", tq)
    monkeypatch.setattr(replay_buffer, "tq", tq)
    return tq
