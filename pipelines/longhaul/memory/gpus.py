"""GPU memory capacities by `resources.gpu_type` (pure).

Capacities are `memory.total` as `nvidia-smi` reports it for the 80 GB / 141 GB / 48 GB parts: the figure vLLM
multiplies by `gpu_memory_utilization` (it reads the same total from the driver). Unknown types fall back to
80 GiB with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20
GiB = 2**30

#: memory.total in MiB (nvidia-smi) per GPU type; keys are lowercase `resources.gpu_type` values.
GPU_MEMORY_MIB: dict[str, int] = {
    "a100": 81920,  # A100-SXM4-80GB / A100 80GB PCIe
    "a800": 81920,  # A800-SXM4-80GB
    "a100-40gb": 40960,  # A100-SXM4-40GB
    "h100": 81559,  # H100 80GB HBM3
    "h800": 81559,  # H800 80GB HBM3
    "h200": 143771,  # H200 141GB HBM3e
    "l40s": 46068,  # L40S 48GB
    "l40": 46068,  # L40 48GB
    "l4": 23034,  # L4 24GB
}
FALLBACK_GPU_MIB = 80 * 1024


@dataclass(frozen=True)
class GpuCapacity:
    gpu_type: str | None
    bytes: int
    known: bool

    def describe(self) -> str:
        if self.known:
            return f"{self.gpu_type}, {self.bytes / GiB:.1f} GiB each ({self.bytes // MiB} MiB, built-in table)"
        what = f"unknown GPU type '{self.gpu_type}'" if self.gpu_type else "resources.gpu_type not set"
        return f"{what}: assuming {self.bytes / GiB:.0f} GiB each"

    def warning(self) -> str | None:
        if self.known:
            return None
        what = f"unknown GPU type '{self.gpu_type}'" if self.gpu_type else "no GPU type set"
        return (
            f"{what}: the memory plan assumes {FALLBACK_GPU_MIB // 1024} GiB per GPU; set resources.gpu_type to one "
            f"of: {', '.join(GPU_MEMORY_MIB)}"
        )


def normalize_gpu_type(gpu_type: str) -> str:
    """'NVIDIA-H100' → 'h100' (case and an 'nvidia' prefix do not matter)."""
    name = gpu_type.lower()
    for prefix in ("nvidia-", "nvidia_", "nvidia"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def gpu_capacity(gpu_type: str | None) -> GpuCapacity:
    """Capacity of one GPU of `gpu_type`; unknown or unset → 80 GiB and `known=False`."""
    mib = GPU_MEMORY_MIB.get(normalize_gpu_type(gpu_type)) if gpu_type else None
    if mib is None:
        return GpuCapacity(gpu_type, FALLBACK_GPU_MIB * MiB, known=False)
    return GpuCapacity(gpu_type, mib * MiB, known=True)
