"""The tiny build's arithmetic: deterministic on a machine, and reported, because it differs between machines.

A warm start of hundreds of AdamW steps is chaotic: the last bits of each sum, which differ between CPUs because
their kernels sum in different orders and widths, grow into different weights. Pinning the kernels did not make
the weights machine-independent (torch's AVX2 kernels with MKL's cross-vendor `COMPATIBLE` branch gave
byte-identical weights on an Intel CPU under emulated AVX2 and AVX-512 kernels, yet a different model on a real
AMD EPYC), and it halved the build's speed. So the build does not promise the same bits everywhere: its recipe
sets the habits the demo depends on through its data (`longhaul.tiny.inputs`), trains until they settle, and
measures them (`longhaul.tiny.checks`); the README gives their spread over seeds and kernels.

What is pinned keeps a build repeatable on one machine (the same key, the same weights): MKL's conditional
numerical reproducibility on the machine's own branch (`MKL_CBWR=AUTO,STRICT`: fixed cache sizes, deterministic
reductions, static scheduling) and a fixed torch thread count (`BUILD_THREADS`, set by the build: reductions split
by thread). Both are read once, before the first kernel, so they are set in the build's child process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: Environment of the build's child process (read by MKL once, before its first kernel).
DETERMINISTIC_ENV: dict[str, str] = {"MKL_CBWR": "AUTO,STRICT"}


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the deterministic settings on top."""
    return {**(os.environ if base is None else base), **DETERMINISTIC_ENV}


def arithmetic_facts() -> dict[str, Any]:
    """What the running process computes with: torch's kernel capability, MKL's branch and threads. Call it inside
    the build's child process."""
    # deferred: torch (~1 s), in the build's child process only
    import torch

    return {
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "torch_threads": torch.get_num_threads(),
    }
