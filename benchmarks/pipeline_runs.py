"""What the pipeline benchmarks (bench_learning.py, bench_async.py) share: one `longhaul run` of a spec in a fresh
run directory, and the evaluation records it leaves."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_pipeline(spec_doc: Mapping[str, Any], name: str, work: Path) -> tuple[Path, int, float]:
    """`longhaul run` of `spec_doc` (written to `<work>/<name>.yaml`) in the fresh run directory `<work>/<name>`,
    its output in `<work>/<name>.log`; (run dir, exit code, wall seconds)."""
    spec = work / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(dict(spec_doc), sort_keys=False))
    run_dir = work / name
    t0 = time.monotonic()
    with (work / f"{name}.log").open("w") as out:
        rc = subprocess.run(
            [sys.executable, "-m", "longhaul.cli", "run", str(spec), "--run-dir", str(run_dir)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode
    return run_dir, rc, time.monotonic() - t0


def eval_step_dir(run_dir: Path, step: int) -> Path:
    """Where the eval stage left checkpoint `step`'s records (`longhaul.layout.Paths.eval_step_dir`)."""
    from longhaul.layout import Paths

    return Path(Paths.under(str(run_dir)).eval_step_dir(step))


def evaluation_records(run_dir: Path, step: int) -> list[dict]:
    """The eval stage's trial records of checkpoint `step`."""
    from longhaul.eval.evaluate import load_records
    from longhaul.layout import EVAL_RESULTS_FILE

    return load_records(eval_step_dir(run_dir, step) / EVAL_RESULTS_FILE)
