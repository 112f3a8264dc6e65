"""Names that once had several definitions now have one; these tests fail when a copy comes back or drifts.

* phases: every backend's status table maps onto `longhaul.k8s.status.Phase` (the Experiment CRD's phases), and
  the CRD schema lists only those phases;
* run names and spec hashes: `longhaul.spec.naming` only (the Kubernetes renderer uses it, no memoised copy);
* the airline write tools: `longhaul.envs.airline.toolnames` only (the environment and PRM-Lite read it);
* rewards: `longhaul.rewards.combine.RewardSettings.combine` is the one place a training reward is assembled.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

import pytest

from longhaul.k8s.status import ACTIVE, TERMINAL, Phase

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipelines" / "longhaul"


def test_every_backend_maps_onto_the_phase_enum() -> None:
    from longhaul.submit import local, slurm

    assert all(isinstance(p, Phase) for p in local.PHASES.values())
    assert all(isinstance(p, Phase) and isinstance(t, bool) for p, t in slurm.PHASES.values())
    # A Slurm phase is terminal exactly when the operator's phase is (the tables agree on what "done" means).
    assert all(t == (p in TERMINAL) for p, t in slurm.PHASES.values())
    assert slurm.phase_of("SOMETHING_NEW") == (Phase.UNKNOWN, False)
    assert Phase.UNKNOWN not in TERMINAL | ACTIVE


def test_kubernetes_status_reads_the_operators_phases(tmp_path: Path) -> None:
    import json
    import subprocess

    from longhaul.submit import kubernetes as K

    (tmp_path / K.RECORD).write_text(json.dumps({"namespace": "ns", "experiment": "e", "run_name": "r"}))
    for phase in Phase:
        doc = {"status": {"phase": phase.value, "jobName": "j"}}

        def runner(argv, doc=doc, **_):  # noqa: ANN001, ANN202
            return subprocess.CompletedProcess(argv, 0, json.dumps(doc), "")

        job = K.fetch_status(tmp_path, runner=runner)["job"]
        assert job["phase"] == phase and job["terminal"] == (phase in TERMINAL)


def test_the_crd_schema_lists_only_phases_of_the_enum() -> None:
    from longhaul.spec.export import STATUS_SCHEMA

    props = STATUS_SCHEMA["properties"]
    enums = [
        props["phase"]["enum"],
        props["seedRuns"]["items"]["properties"]["phase"]["enum"],
        props["history"]["items"]["properties"]["phase"]["enum"],
    ]
    for enum in enums:
        assert set(enum) <= {p.value for p in Phase}
    assert set(enums[0]) == {p.value for p in Phase} - {Phase.SUPERSEDED, Phase.UNKNOWN}


def test_the_kubernetes_renderer_names_runs_with_spec_naming() -> None:
    from longhaul.render import kubernetes as RK
    from longhaul.spec import naming

    assert RK.run_name is naming.run_name and RK.spec_hash is naming.spec_hash


def test_spec_hash_memo_follows_the_object() -> None:
    from longhaul.spec import load_spec
    from longhaul.spec.naming import canonical_json, spec_hash

    a = load_spec(ROOT / "specs" / "smoke.yaml")
    b = a.model_copy(update={"metadata": a.metadata.model_copy(update={"name": "other"})})
    for exp in (a, b, a):
        assert spec_hash(exp) == hashlib.sha256(canonical_json(exp).encode()).hexdigest()
    assert spec_hash(a) != spec_hash(b)


def test_write_tools_are_defined_once() -> None:
    from longhaul.envs.airline import toolnames
    from longhaul.rewards import prm_lite

    assert prm_lite.WRITE_TOOLS is toolnames.WRITE_TOOLS
    assert toolnames.WRITE_TOOLS <= set(toolnames.TOOL_NAMES)
    assert _assignments("WRITE_TOOLS") == ["envs/airline/toolnames.py"]


def _assignments(name: str) -> list[str]:
    """Modules of the package that assign `name` at module level."""
    out = []
    for f in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                out.append(str(f.relative_to(PACKAGE)))
    return out


@pytest.mark.parametrize("name", ["combine_reward"])
def test_only_reward_settings_assemble_a_training_reward(name: str) -> None:
    """`combine_reward` is called only by `RewardSettings.combine` (which decides whether the process reward
    counts); the agent loop and `longhaul explain` call that."""
    callers = []
    for f in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
                callers.append(str(f.relative_to(PACKAGE)))
    assert callers == ["rewards/combine.py"]
