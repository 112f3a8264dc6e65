"""Headless Debian Chromium for tests that look at MLflow's UI as a user would (tests marked `browser`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run",
    # Charts only draw when every compositor stage runs before the capture.
    "--run-all-compositor-stages-before-draw", "--virtual-time-budget=30000",
)  # fmt: skip


def chromium() -> str:
    """Path of the Chromium executable; fails the test, saying how to install it, when there is none."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail(
            "headless Chromium is missing: run scripts/ci/chromium.sh (Debian packages chromium, chromium-driver)"
        )
    return exe


def run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with `args` (e.g. `--dump-dom URL`) in its own profile directory."""
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
