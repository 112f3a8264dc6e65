"""`longhaul --help` starts without any command's heavy dependencies (issue #32 item 6).

Each command imports what it runs inside its own body (`longhaul.commands`), so the CLI's start-up loads typer,
rich and the command modules only. Checked on the modules `python -X importtime` reports, never on times
(`benchmarks/bench_cli.py` measures those).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Never imported to start the CLI or print its help: the training, tracking and serving stacks.
HEAVY = ("torch", "transformers", "mlflow", "ray", "verl", "vllm", "peft", "pandas", "pyarrow", "matplotlib", "httpx")
#: Nor the modules of longhaul that build the whole schema or need it (what `validate` and the others load).
DEFERRED_LONGHAUL = ("longhaul.spec.models", "longhaul.spec.load", "longhaul.render", "longhaul.memory")

START = {
    "import longhaul.cli": "import longhaul.cli",
    "longhaul --help": (
        "import sys; from longhaul.cli import app; sys.argv = ['longhaul', '--help']; app(prog_name='longhaul')"
    ),
}


def _imported_modules(code: str) -> tuple[set[str], str]:
    """The modules `code` imports (from `-X importtime`, which writes one line per module to stderr) and stdout."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return modules, proc.stdout


@pytest.mark.parametrize("what", sorted(START))
def test_cli_start_imports_no_heavy_dependency(what: str) -> None:
    modules, stdout = _imported_modules(START[what])
    assert "longhaul.cli" in modules
    if what.endswith("--help"):
        assert "validate" in stdout and "sft" in stdout  # the help was printed, every command listed
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"`{what}` imports {heavy[:20]}"
    deferred = sorted(m for m in modules if m.startswith(DEFERRED_LONGHAUL))
    assert not deferred, f"`{what}` imports {deferred}"
