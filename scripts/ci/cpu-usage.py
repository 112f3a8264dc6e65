"""How busy the machine's cores were during a phase, in one line: whether a phase is bound by CPU work (cut work)
or by waiting (overlap more).

    python scripts/ci/cpu-usage.py start FILE          # record /proc/stat's CPU counters in FILE
    python scripts/ci/cpu-usage.py report FILE LABEL   # print the core-seconds busy and idle since then

CI brackets its test phase with it (`scripts/test-all.sh`). Counters are the kernel's since boot, so everything
on the machine is counted, not only the tests. Linux only; elsewhere, or on any read error, it says so and exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

#: /proc/stat's first line: `cpu user nice system idle iowait irq softirq steal ...` (USER_HZ ticks).
STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)  # idle, iowait


def counters() -> tuple[int, int]:
    """(busy ticks, idle ticks) over all cores since boot."""
    fields = [int(x) for x in STAT.read_text(encoding="ascii").splitlines()[0].split()[1:9]]
    idle = sum(fields[i] for i in IDLE_FIELDS)
    return sum(fields) - idle, idle


def summary(start: dict, busy: int, idle: int, now: float, hz: int, cores: int) -> str:
    """The line printed for a phase that began at `start` (as `main` records it)."""
    busy_s = (busy - start["busy"]) / hz
    idle_s = (idle - start["idle"]) / hz
    wall = max(now - start["time"], 1e-9)
    return (
        f"{busy_s:.0f} core-s busy, {idle_s:.0f} core-s idle in {wall:.0f} s: {100 * busy_s / (wall * cores):.0f} % "
        f"of {cores} cores"
    )


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("start", "report") or (argv[0] == "report" and len(argv) < 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path = Path(argv[1])
    try:
        busy, idle = counters()
        if argv[0] == "start":
            path.write_text(json.dumps({"busy": busy, "idle": idle, "time": time.time()}), encoding="utf-8")
            return 0
        start = json.loads(path.read_text(encoding="utf-8"))
        line = summary(start, busy, idle, time.time(), os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        print(f"cpu usage: not available ({exc})")
        return 0
    print(f"cpu usage ({argv[2]}): {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
