"""Only the device differs: every shipped GPU spec and its CPU twin render the same veRL overrides except for the
keys in `longhaul.render.devices.CPU_DIFFERENCES`, each with its reason; no entry of that list is stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from longhaul.layout import Paths
from longhaul.render.devices import (
    CPU_DIFFERENCES,
    CPU_SERVER_DIFFERENCES,
    CPU_SPEC_CHANGES,
    cpu_twin,
    device_differences,
    server_differences,
    server_settings,
)
from longhaul.render.plan import render_policy_server, render_simulator_server
from longhaul.render.verl import render_verl_overrides
from longhaul.spec import load_spec

ROOT = Path(__file__).resolve().parents[3]
GPU_SPECS = [p for p in sorted((ROOT / "specs").glob("*.yaml")) if load_spec(p).spec.resources.gpus_per_node > 0]


def _diff(path: Path) -> dict[str, tuple[str | None, str | None]]:
    exp = load_spec(path)
    paths = Paths.under("/runs/twin")  # one run directory for both: paths are not a device difference
    gpu, cpu = render_verl_overrides(exp, paths), render_verl_overrides(cpu_twin(exp), paths)
    diffs = device_differences(gpu, cpu)
    print(f"\n{path.name}: {len(diffs)} differing overrides")
    for key, (g, c) in diffs.items():
        print(f"  {key}: {g} -> {c}")
    return diffs


def test_there_are_gpu_specs() -> None:
    assert len(GPU_SPECS) >= 5, GPU_SPECS


@pytest.mark.parametrize("path", GPU_SPECS, ids=[p.stem for p in GPU_SPECS])
def test_cpu_twin_differs_only_by_the_allow_list(path: Path) -> None:
    diffs = _diff(path)
    unexplained = sorted(set(diffs) - set(CPU_DIFFERENCES))
    assert not unexplained, f"{path.name}: CPU/GPU differences without a reason in CPU_DIFFERENCES: {unexplained}"
    twin = cpu_twin(load_spec(path))
    assert twin.spec.resources.gpus_per_node == 0
    # The same rollout engine and FSDP version on both devices.
    for key in ("actor_rollout_ref.rollout.name", "actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy"):
        assert key not in diffs


def test_every_allowed_difference_occurs() -> None:
    """An entry no shipped spec needs is stale: remove it (or the CPU branch silently renders the GPU value)."""
    seen = set().union(*(_diff(p) for p in GPU_SPECS))
    stale = sorted(set(CPU_DIFFERENCES) - seen)
    assert not stale, f"CPU_DIFFERENCES entries that no GPU spec's twin needs: {stale}"
    assert all(reason.strip() for reason in CPU_DIFFERENCES.values())
    assert all(reason.strip() for _v, reason in CPU_SPEC_CHANGES.values())


def test_an_unlisted_difference_is_caught() -> None:
    """The check can fail: a CPU override that is not in the list shows up as unexplained."""
    gpu = ["a.b=1", "trainer.device=cuda"]
    cpu = ["a.b=2", "trainer.device=cpu", "+c.d=x"]
    assert set(device_differences(gpu, cpu)) - set(CPU_DIFFERENCES) == {"a.b", "+c.d"}


def _server_diff(path: Path) -> dict[str, tuple[str | None, str | None]]:
    """The launcher's vLLM servers (simulator when colocated, evaluation policy) of a GPU spec against its twin."""
    exp = load_spec(path)
    twin = cpu_twin(exp)
    diffs: dict[str, tuple[str | None, str | None]] = {}
    for render in (render_simulator_server, render_policy_server):
        gpu, cpu = render(exp), render(twin)
        if gpu is None:
            continue
        found = server_differences(gpu, cpu)
        print(f"\n{path.name} {gpu.role} server: " + ", ".join(f"{k}: {g} -> {c}" for k, (g, c) in found.items()))
        diffs.update(found)
    return diffs


@pytest.mark.parametrize("path", GPU_SPECS, ids=[p.stem for p in GPU_SPECS])
def test_cpu_twin_servers_differ_only_by_the_allow_list(path: Path) -> None:
    diffs = _server_diff(path)
    unexplained = sorted(set(diffs) - set(CPU_SERVER_DIFFERENCES))
    assert not unexplained, f"{path.name}: server differences without a reason in CPU_SERVER_DIFFERENCES: {unexplained}"
    # The same server, model and sampling seed on both devices.
    for key in ("--model", "--served-model-name", "--max-model-len", "--max-num-seqs", "--seed", "--dtype"):
        assert key not in diffs


def test_every_allowed_server_difference_occurs() -> None:
    seen = set().union(*(_server_diff(p) for p in GPU_SPECS))
    stale = sorted(set(CPU_SERVER_DIFFERENCES) - seen)
    assert not stale, f"CPU_SERVER_DIFFERENCES entries that no GPU spec's twin needs: {stale}"


def test_server_settings_reads_flags_switches_and_environment() -> None:
    argv = ("python", "-m", "vllm.x", "--model", "m", "--enforce-eager", "--kv-cache-memory-bytes=5", "--seed", "0")
    assert server_settings(argv, {"A": "1"}) == {
        "env A": "1",
        "--model": "m",
        "--enforce-eager": "",
        "--kv-cache-memory-bytes": "5",
        "--seed": "0",
    }
