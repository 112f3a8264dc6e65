"""Checkpoint faults shared by the reliability tests of real veRL saves (tests/reliability/test_verl_save_faults.py)
and of the real pipeline (tests/reliability/test_launcher_faults.py): a small filesystem to fill, digests of a
checkpoint, and the step veRL's own resume would choose."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from longhaul.tiny.build import DEFAULT_OUT_DIR, POLICY_DIRNAME

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / DEFAULT_OUT_DIR / POLICY_DIRNAME


def tiny_policy() -> Path:
    """The project's tiny policy (`longhaul tiny build`); fails the test when it was not built."""
    if not (POLICY / "config.json").is_file():
        pytest.fail(f"{POLICY} is missing: run `longhaul tiny build` first")
    return POLICY


@contextmanager
def small_filesystem(path: Path, size_bytes: int) -> Iterator[bool]:
    """A tmpfs of `size_bytes` mounted at `path` for the block (True), or False where mounting is not permitted
    (not root, no CAP_SYS_ADMIN); unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        mounted = res.returncode == 0
    except OSError:
        mounted = False
    try:
        yield mounted
    finally:
        if mounted:
            if subprocess.run(["umount", str(path)], capture_output=True, timeout=60).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=60)


def digest(d: Path) -> dict[str, str]:
    """sha256 of every file under `d`, by relative path."""
    return {
        str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.rglob("*")) if f.is_file()
    }


def tree_bytes(d: Path) -> int:
    """Bytes of every file under `d`."""
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def verl_choice(ckpt: Path) -> str | None:
    """The step directory veRL's own resume would load (`trainer.resume_mode=auto`)."""
    # deferred: veRL (seconds to import), only in the tests that read its choice
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    try:
        found = find_latest_ckpt_path(str(ckpt))
    except ValueError as exc:  # a tracker cut short: veRL cannot resume at all
        return f"error: {exc}"
    return Path(found).name if found else None
