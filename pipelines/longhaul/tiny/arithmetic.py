"""Machine-independent arithmetic for the tiny build: the same weights from the same inputs on any x86-64 CPU
with AVX2 (Intel or AMD, AVX2 or AVX-512).

Why: a warm start of 800 AdamW steps at a high learning rate is chaotic. The last bits of each sum, which differ
between CPUs because their kernels sum in different orders and widths, grow into different models with different
habits: the same build key built under AVX2 kernels on this machine gave a policy whose demo started at train
pass^1 0.646 instead of 0.396 (README "Does the demo learn?"). The build therefore runs in a child process whose
kernels are pinned before torch loads (both are read once, at start-up):

- `ATEN_CPU_CAPABILITY=avx2`: torch's own vectorised kernels (norms, softmax, attention, reductions, AdamW) run
  their AVX2 build on every CPU that has AVX2, instead of AVX-512 where available. These kernels use exact
  instructions (no approximate reciprocals), so the same code gives the same bits on Intel and AMD.
- `MKL_CBWR=COMPATIBLE,STRICT`: MKL's conditional numerical reproducibility in its one branch that holds across
  vendors (SSE2 without the approximate rcpps/rsqrtps; MKL ignores the other branches on non-Intel CPUs), strict.
- a fixed torch thread count (`BUILD_THREADS`, set by the build): MKL's and torch's reductions split by threads.

Only the build is pinned: serving and training keep each machine's fastest kernels (their rounding differences do
not compound over hundreds of steps from the same start; README).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from longhaul.machine import cpu_flags as read_flags

#: Environment of the build's child process (read by torch and MKL once, before their first kernel).
REPRODUCIBLE_ENV: dict[str, str] = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE,STRICT"}


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the reproducible settings on top."""
    return {**(os.environ if base is None else base), **REPRODUCIBLE_ENV}


def arithmetic_facts(cpu_flags: set[str] | None = None) -> dict[str, Any]:
    """What the running process computes with: torch's kernel capability, MKL's branch, threads, and whether that
    is the machine-independent setting (`reproducible`). Call it inside the build's child process."""
    # deferred: torch (~1 s), in the build's child process only
    import torch

    flags = read_flags() if cpu_flags is None else cpu_flags
    capability = torch.backends.cpu.get_cpu_capability()
    reproducible = (
        "avx2" in flags
        and capability == REPRODUCIBLE_ENV["ATEN_CPU_CAPABILITY"].upper()
        and os.environ.get("MKL_CBWR") == REPRODUCIBLE_ENV["MKL_CBWR"]
    )
    return {
        "torch_cpu_capability": capability,
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "torch_threads": torch.get_num_threads(),
        "reproducible": reproducible,
    }
