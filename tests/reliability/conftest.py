"""The reliability suite's report: every fault-injection test records what it injected, what survived and what
was lost, and the session prints one table (also `scripts/reliability_report.py FILE`, quoted in the README).

Records go to `$LONGHAUL_RELIABILITY_REPORT` (default `build/reliability.jsonl`, emptied once per session), one
JSON object per line: `{"area", "fault", "injected", "survived", "lost", "lost_what"}`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from support.reliability import REPORT_ENV, Record, load_records, render_table

ROOT = Path(__file__).resolve().parents[2]


def _report_path() -> Path:
    return Path(os.environ.get(REPORT_ENV) or ROOT / "build" / "reliability.jsonl")


@pytest.fixture(scope="session", autouse=True)
def _fresh_report() -> None:
    """Empty the report once per session, before the first reliability test (a subdirectory's conftest is loaded
    after `pytest_sessionstart` has run, so the hook cannot do it)."""
    path = _report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")


@pytest.fixture
def reliability() -> Callable[..., None]:
    """`reliability(area, fault, injected=, survived=, lost=, lost_what=)`: add one line to the report.

    Record what the test measured, before asserting on it, so a failing run still shows its figures."""

    def record(area: str, fault: str, *, injected: int, survived: int, lost: int = 0, lost_what: str = "") -> None:
        rec = Record(area, fault, injected, survived, lost, lost_what)
        with open(_report_path(), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec.to_dict()) + "\n")

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    path = _report_path()
    records = load_records(path) if path.is_file() else []
    if records:
        terminalreporter.write_sep("=", "reliability: injected / survived / lost")
        terminalreporter.write(render_table(records))
