#!/usr/bin/env python3
"""Print the reliability suite's table: `scripts/reliability_report.py [build/reliability.jsonl]`.

`make reliability` runs the suite (tests/reliability) and prints it; CI prints it at the end of pytest."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.reliability import load_records, render_table  # noqa: E402


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else ROOT / "build" / "reliability.jsonl"
    if not path.is_file():
        print(f"{path}: no reliability report; run `make reliability` first", file=sys.stderr)
        return 2
    sys.stdout.write(render_table(load_records(path)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
