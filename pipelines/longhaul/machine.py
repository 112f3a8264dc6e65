"""The machine a run ran on, in one line: the CPU model, its logical cores, and the vector extensions that change
CPU arithmetic (a tiny model's greedy habits can hang on the rounding of a matrix product, so a learning curve is
read beside the machine that produced it).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Instruction-set extensions that select different CPU kernels (oneDNN / torch's CPU backend), in print order.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


def parse_cpuinfo(cpuinfo: str) -> tuple[str, set[str]]:
    """(model name, flags) of the first processor in the text of /proc/cpuinfo (pure)."""
    model, flags = "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = " ".join(value.split()) or model
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def describe_cpu(cpuinfo: str, cores: int | None) -> str:
    """'<model name>, <n> cores, <flags>' from the text of /proc/cpuinfo (pure; unknown parts say so)."""
    model, flags = parse_cpuinfo(cpuinfo)
    shown = [f for f in VECTOR_FLAGS if f in flags]
    parts = [model, f"{cores} cores" if cores else "cores unknown", " ".join(shown) if shown else "no AVX2"]
    return ", ".join(parts)


def _cpuinfo_text() -> str:
    try:
        return CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpu_flags() -> set[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo cannot be read)."""
    return parse_cpuinfo(_cpuinfo_text())[1]


def machine_line() -> str:
    """This machine's CPU in one line (see `describe_cpu`); 'unknown CPU' where /proc/cpuinfo cannot be read."""
    return describe_cpu(_cpuinfo_text(), os.cpu_count())
