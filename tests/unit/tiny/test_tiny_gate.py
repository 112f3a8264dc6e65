"""The tiny build's warm starts stop at their first check that meets the criteria (`longhaul.tiny.gate`), through
the real warm-start loop on a tiny random model."""

from __future__ import annotations

from longhaul.tiny.checks import Criterion
from longhaul.tiny.gate import Gate


class _Model:
    """Records the mode the gate leaves the model in while it measures."""

    def __init__(self) -> None:
        self.modes: list[str] = []

    def eval(self) -> None:
        self.modes.append("eval")

    def train(self) -> None:
        self.modes.append("train")


def _gate(values: list[float], *, every: int = 10, first: int = 20, stop: bool = True):
    """A gate whose n-th measurement reads values[n] against a floor of 0.5."""
    model, lines, calls = _Model(), [], iter(values)

    def measure():
        v = next(calls)
        return {"v": v}, [Criterion("c", v, 0.5)]

    return Gate(model, measure, every, first, stop, lines.append), model, lines


def test_checks_run_every_n_steps_from_the_first_and_stop_at_the_first_that_meets_all():
    gate, model, lines = _gate([0.1, 0.4, 0.6, 0.9])
    stopped = next(step for step in range(100) if gate(step))
    # Checks after 20, 30, 40 steps (never before 20, never between): the third meets the floor.
    assert stopped == 39 and [h["steps"] for h in gate.history] == [20, 30, 40]
    assert gate.findings_at(40) == {"v": 0.6} and gate.findings_at(30) is None
    assert model.modes[:2] == ["eval", "train"]  # measured in eval mode, training resumes in train mode
    assert lines[2].endswith("c 0.600 (all met)") and "all met" not in lines[1]


def test_without_stop_the_gate_only_records_and_never_checks_when_off():
    gate, _, _ = _gate([0.9, 0.9, 0.9], stop=False)
    assert not any(gate(step) for step in range(40))
    assert [h["steps"] for h in gate.history] == [20, 30, 40]
    off, _, _ = _gate([], every=0)
    assert not any(off(step) for step in range(100)) and off.history == []


def test_the_warm_start_loop_stops_where_the_gate_says():
    import torch

    from longhaul.sft.masking import SupervisedExample
    from longhaul.tiny.models import POLICY_ARCH, build_model
    from longhaul.tiny.warmstart import warm_start

    model = build_model(POLICY_ARCH, vocab_size=64, eos_token_id=1, pad_token_id=0, seed=0)
    ids = torch.randint(2, 64, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    example = SupervisedExample(input_ids=ids, labels=[-100] * 6 + ids[6:], spans=[(6, 12)])
    gate, _, _ = _gate([0.2, 0.7], every=2, first=2)
    result = warm_start(model, [example], steps=50, seed=0, prefix_refresh=0, stop_after=gate)
    assert result.steps == 4  # checks after 2 and 4 steps; the second meets the floor
