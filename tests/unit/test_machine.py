"""The machine line printed beside a learning curve: read from /proc/cpuinfo's text."""

from __future__ import annotations

from longhaul.machine import describe_cpu, machine_line

EPYC = """processor	: 0
vendor_id	: AuthenticAMD
model name	: AMD EPYC 9R14 96-Core Processor
flags		: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16

processor	: 1
model name	: AMD EPYC 9R14 96-Core Processor
flags		: fpu sse2 avx avx2 avx512f avx512_vnni avx512_bf16
"""


def test_model_cores_and_the_vector_extensions_that_select_kernels():
    assert describe_cpu(EPYC, 2) == "AMD EPYC 9R14 96-Core Processor, 2 cores, avx2 avx512f avx512_bf16 avx512_vnni"


def test_unknown_parts_say_so():
    assert describe_cpu("", None) == "unknown CPU, cores unknown, no AVX2"
    assert describe_cpu("model name\t: Old Chip\nflags\t\t: sse2 avx\n", 4) == "Old Chip, 4 cores, no AVX2"


def test_this_machine_has_a_line():
    line = machine_line()
    assert line.count(", ") >= 2 and "cores" in line
