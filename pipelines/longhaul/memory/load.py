"""Thin I/O for the memory planner: a model's `config.json` from its local `path`, else the built-in table.

Offline only: `ModelRef.path` (relative paths against the working directory, as the launcher resolves them) or
the shapes of the shipped models in `longhaul.memory.shapes.BUILTIN_CONFIGS`. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

from longhaul import bounded
from longhaul.memory.plan import compute_memory_plan
from longhaul.memory.plan_text import summarize_memory_plan
from longhaul.memory.plan_values import MemoryPlan
from longhaul.memory.shapes import BUILTIN_CONFIGS, ModelShape, ShapeError, builtin_shape, shape_from_config
from longhaul.spec.models import Experiment
from longhaul.spec.serving import ModelRef
from longhaul.spec.simulator import Placement


class UnknownModel(LookupError):
    """No shape for a model: no local config.json and not in the built-in table."""


def load_model_shape(ref: ModelRef, *, field: str, cwd: Path | None = None) -> ModelShape:
    """The shape of `ref`: its local `config.json` when `path` is a directory here, else the built-in table."""
    if ref.path:
        directory = Path(ref.path).expanduser()
        if not directory.is_absolute():
            directory = (cwd or Path.cwd()) / directory
        config = directory / "config.json"
        if config.is_file():
            try:
                data = bounded.read_json(config, bounded.SMALL_JSON, expected="a model's config.json")
            except (bounded.InputError, OSError) as exc:
                raise UnknownModel(f"{field}.path: cannot read {config}: {exc}") from None
            try:
                return shape_from_config(data, str(config))
            except ShapeError as exc:
                raise UnknownModel(f"{field}.path: {exc}") from None
    shape = builtin_shape(ref.name)
    if shape is not None:
        return shape
    where = f"no config.json under {ref.path} (relative to {cwd or Path.cwd()})" if ref.path else "no `path`"
    hint = (
        "build it with `longhaul tiny build`"
        if ref.path and "tiny" in ref.path
        else f"set {field}.path to a local directory holding the model's config.json"
    )
    raise UnknownModel(
        f"{field}.name: no shape for model '{ref.name}': {where}, and it is not in the built-in table "
        f"({', '.join(BUILTIN_CONFIGS)}); {hint}"
    )


def load_memory_plan(exp: Experiment, *, cwd: Path | None = None) -> MemoryPlan:
    """Read the models' shapes and compute the plan; raises `UnknownModel` when a shape is missing."""
    policy = load_model_shape(exp.spec.policy.model, field="spec.policy.model", cwd=cwd)
    simulator = None
    if exp.spec.user_simulator.placement == Placement.COLOCATED:
        simulator = load_model_shape(exp.spec.user_simulator.model, field="spec.user_simulator.model", cwd=cwd)
    return compute_memory_plan(exp, policy, simulator)


def memory_summary(exp: Experiment, *, cwd: Path | None = None) -> str:
    """The plan in one line (`summarize_memory_plan`) for `longhaul status` and the Experiment status, or why there
    is none (a model without a local config.json outside the built-in table)."""
    try:
        return summarize_memory_plan(load_memory_plan(exp, cwd=cwd))
    except UnknownModel as exc:
        return f"unavailable: {exc}"
