"""How fast this machine is right now, in one line: seconds to compile the standard library's `asyncio` and `email`
packages (source to code objects, in memory) ten times on one core.

CI prints it before and after the test phase (`scripts/test-all.sh`): a shared host's speed drifts (in one session
the same compile took 9.5 s, then 12.6 s an hour later, the machine idle both times), so phase times are compared
between runs together with it. It reads only the interpreter's own files and writes nothing.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROUNDS = 10


def probe() -> float:
    """Seconds for ROUNDS compiles of the two packages' sources."""
    import asyncio
    import email

    sources = [
        (p.read_text(encoding="utf-8"), str(p))
        for pkg in (asyncio, email)
        for p in sorted(Path(pkg.__file__).parent.glob("*.py"))
    ]
    t0 = time.perf_counter()
    for _ in range(ROUNDS):
        for text, name in sources:
            compile(text, name, "exec", dont_inherit=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    label = sys.argv[1] if len(sys.argv) > 1 else "now"
    print(f"speed probe ({label}): {probe():.2f} s (one core; lower is faster)")
