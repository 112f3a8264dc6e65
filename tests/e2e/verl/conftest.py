"""One veRL training stage against a scripted user simulator, shared by the veRL end-to-end tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from support.fault_user_sim import Fault, FaultyUserSimulator

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "specs" / "smoke.yaml"


def run_grpo_stage(
    base: Path,
    tasks: Sequence[int],
    faults: Sequence[Fault],
    spec_doc: Callable[[str], dict],
    timeout_s: int = 1200,
    extra_env: Mapping[str, str] | None = None,
) -> SimpleNamespace:
    """`longhaul run <spec> --stage grpo --run-dir <base>/run` with the user simulator `FaultyUserSimulator`
    (`faults` handed out to the tasks in the order it sees them); `spec_doc(simulator_url)` gives the spec,
    `extra_env` what the run's environment gets on top of this process's (a test probe).
    Returns the run directory, the CLI's output and exit code, the spec and the simulator (its requests)."""
    from longhaul.envs.airline.tasks import get_task

    doc0 = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    policy = ROOT / doc0["spec"]["policy"]["model"]["path"]
    if not policy.exists():
        pytest.fail(f"{policy} is missing: run `longhaul tiny build` first")
    scenarios = {str(t): get_task(str(t)).user_instructions() for t in tasks}
    run_dir = base / "run"
    sim = FaultyUserSimulator(scenarios, list(faults), model=doc0["spec"]["user_simulator"]["model"]["name"])
    with sim:
        doc = spec_doc(sim.base_url)
        spec_file = base / "spec.yaml"
        spec_file.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        env = {**os.environ, **(extra_env or {})}
        env.pop("MLFLOW_TRACKING_URI", None)
        longhaul = shutil.which("longhaul", path=str(Path(sys.executable).parent)) or "longhaul"
        proc = subprocess.run(
            [longhaul, "run", str(spec_file), "--stage", "grpo", "--run-dir", str(run_dir)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    out = proc.stdout + proc.stderr
    (base / "run.out").write_text(out)
    return SimpleNamespace(dir=run_dir, out=out, rc=proc.returncode, doc=doc, sim=sim)
