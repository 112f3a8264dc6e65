"""`spec.resources`: the compute of each job (nodes, GPUs, CPUs, memory, time limit), the same on every backend.

The form of a quantity and a time limit is the field's pattern; its meaning is checked by `longhaul.spec.quantities`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from longhaul.spec.base import SpecModel
from longhaul.spec.bounds import MAX_CPUS_PER_NODE, MAX_GPUS_PER_NODE, NodeCount
from longhaul.spec.quantities import check_quantity, check_time_limit
from longhaul.spec.strings import SafeToken

TIME_LIMIT = r"^(\d+-)?\d{1,3}:\d{2}:\d{2}$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$"


class ResourcesSpec(SpecModel):
    nodes: NodeCount = Field(default=1, description="Nodes (> 1 uses Ray across nodes).")
    gpus_per_node: int = Field(
        default=2, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs per node (0 = CPU-only smoke run)."
    )
    gpu_type: SafeToken | None = Field(default=None, description="GPU type for scheduling (e.g. a800, h100).")
    cpus_per_node: int = Field(default=16, ge=1, le=MAX_CPUS_PER_NODE, description="CPUs per node.")
    memory: Annotated[str, AfterValidator(check_quantity(minimum="1Gi"))] = Field(
        default="256Gi",
        pattern=QUANTITY,
        max_length=32,
        description="Memory per node (Kubernetes quantity), at least 1Gi (torch, Ray and vLLM must start).",
    )
    time_limit: Annotated[str, AfterValidator(check_time_limit)] = Field(
        default="3-00:00:00",
        pattern=TIME_LIMIT,
        max_length=32,
        description="Wall-clock limit, [D-]HH:MM:SS (both backends).",
    )
    shm_size: Annotated[str, AfterValidator(check_quantity(minimum="1Mi"))] = Field(
        default="32Gi", pattern=QUANTITY, max_length=32, description="/dev/shm size (NCCL, Ray), at least 1Mi."
    )
