"""Memory planner: per GPU and per phase, what the simulator, the policy engine and the FSDP trainer hold.

`shapes`, `gpus`, `estimate` and `plan` are pure; `load` reads a model's config.json (the only I/O).
"""

from longhaul.memory.plan import compute_memory_plan
from longhaul.memory.plan_text import render_memory_plan
from longhaul.memory.plan_values import Issue, MemoryPlan
from longhaul.memory.shapes import BUILTIN_CONFIGS, ModelShape, shape_from_config

__all__ = [
    "BUILTIN_CONFIGS",
    "Issue",
    "MemoryPlan",
    "ModelShape",
    "compute_memory_plan",
    "render_memory_plan",
    "shape_from_config",
]
