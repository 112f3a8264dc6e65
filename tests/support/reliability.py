"""Records and the table of the reliability suite (tests/reliability); `scripts/reliability_report.py` prints it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: Where the suite writes its records (JSON lines); default build/reliability.jsonl.
REPORT_ENV = "LONGHAUL_RELIABILITY_REPORT"


@dataclass(frozen=True)
class Record:
    """One kind of fault: how many were injected, how many the system survived (recovered to a correct state),
    and how much was lost (checkpoints, metrics, duplicate Jobs, accepted injections — named by `lost_what`)."""

    area: str
    fault: str
    injected: int
    survived: int
    lost: int = 0
    lost_what: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def load_records(path: str | Path) -> list[Record]:
    """The records of a report file (later records of the same area and fault add up)."""
    merged: dict[tuple[str, str, str], Record] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = Record(**json.loads(line))
        key = (r.area, r.fault, r.lost_what)
        if key in merged:
            m = merged[key]
            r = Record(r.area, r.fault, m.injected + r.injected, m.survived + r.survived, m.lost + r.lost, r.lost_what)
        merged[key] = r
    return list(merged.values())


def render_table(records: Sequence[Record]) -> str:
    """A markdown table, one row per (area, fault), and a total row."""
    lines = ["| area | fault | injected | survived | lost |", "|---|---|---:|---:|---|"]
    for r in sorted(records, key=lambda r: (r.area, r.fault)):
        lost = f"{r.lost} {r.lost_what}".strip()
        lines.append(f"| {r.area} | {r.fault} | {r.injected} | {r.survived} | {lost} |")
    lines.append(
        f"| **total** | | {sum(r.injected for r in records)} | {sum(r.survived for r in records)} | "
        f"{sum(r.lost for r in records)} |"
    )
    return "\n".join(lines) + "\n"
