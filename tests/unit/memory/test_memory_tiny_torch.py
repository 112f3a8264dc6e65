"""The planner's parameter, gradient and AdamW-state bytes for the tiny policy against what torch allocates for
the model and an AdamW optimizer after one step (CPU; the tiny policy is built by `longhaul tiny build`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longhaul.memory.load import load_memory_plan
from longhaul.spec import load_spec
from support.specs import SPECS_DIR

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = 0.15


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def test_planner_bytes_match_torch_for_the_tiny_policy() -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    exp = load_spec(SPECS_DIR / "smoke.yaml")  # the spec that trains the tiny policy: fp32, full fine-tuning
    path = ROOT / exp.spec.policy.model.path
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} is missing: run `longhaul tiny build` (make tiny)")
    plan = load_memory_plan(exp, cwd=ROOT)
    (training,) = [p for p in plan.phases if p.name == "training"]

    def planned(prefix: str) -> int:
        (row,) = [r for r in training.rows if r.label.startswith(prefix)]
        return row.values[0]

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    params = _storage_bytes(model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = _storage_bytes(p.grad for p in model.parameters() if p.grad is not None)
    optimizer.step()
    states = _storage_bytes(t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))

    for name, plan_bytes, torch_bytes in (
        ("parameters", planned("actor parameters"), params),
        ("gradients", planned("actor gradients"), grads),
        ("AdamW states", planned("actor AdamW states"), states),
    ):
        assert torch_bytes > 0
        assert abs(plan_bytes - torch_bytes) <= TOLERANCE * torch_bytes, (name, plan_bytes, torch_bytes)
