"""The tiny build's arithmetic is deterministic on a machine, and its criteria are what carries between machines.

Another CPU is emulated on this one by the settings that select kernels (`MKL_ENABLE_INSTRUCTIONS`, MKL's dispatch;
`ATEN_CPU_CAPABILITY`, torch's vectorised kernels): the weights change within a few warm-start steps, which is
why the build holds its models to criteria instead of promising bits (`longhaul.tiny.arithmetic`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from longhaul.tiny.arithmetic import DETERMINISTIC_ENV, child_env
from longhaul.tiny.build import BUILD_THREADS, TinyBuildConfig
from longhaul.tiny.checks import CHECK_TEMPERATURE, Criterion, criteria
from longhaul.tiny.recipe import CONFIG_FILE, REPORT_FILE

ROOT = Path(__file__).resolve().parents[3]

#: Kernel-selection settings of another, older CPU, emulated on this one (any x86-64 CPU has SSE4.2 and AVX2's
#: predecessors; torch's "default" kernels are its non-vectorised build).
OLDER_MACHINE = {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"}


def _recipe(tmp_path, name: str, env: dict[str, str], steps: int = 6) -> tuple[str, dict]:
    """Run the recipe's child process (a few warm-start steps, no checks) under `env`; digest of both models."""
    build = tmp_path / name
    build.mkdir()
    config = {
        **asdict(TinyBuildConfig(steps=steps, user_steps=steps, check_prompts=0, check_user_tasks=0)),
        "threads": BUILD_THREADS,
    }
    (build / CONFIG_FILE).write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "longhaul.tiny.recipe", str(build)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    digest = hashlib.sha256()
    for role in ("tiny-policy", "tiny-user"):
        digest.update((build / role / "model.safetensors").read_bytes())
    return digest.hexdigest(), json.loads((build / REPORT_FILE).read_text())


@pytest.mark.slow
def test_other_weights_under_another_machines_kernels(tmp_path):
    """(The same weights twice on one machine: test_tiny_build.py's forced rebuild, through the same child.)"""
    base = {k: v for k, v in os.environ.items() if k not in {*OLDER_MACHINE, *DETERMINISTIC_ENV}}
    first, report = _recipe(tmp_path, "first", child_env(base))
    assert report["arithmetic"] == {
        "torch_cpu_capability": report["arithmetic"]["torch_cpu_capability"],
        "mkl_cbwr": DETERMINISTIC_ENV["MKL_CBWR"],
        "torch_threads": BUILD_THREADS,
    }
    older, older_report = _recipe(tmp_path, "older", child_env({**base, **OLDER_MACHINE}))
    assert older_report["arithmetic"]["torch_cpu_capability"] == "DEFAULT"
    assert older != first  # rounding differs between machines: the criteria, not the bits, carry


def test_criteria_come_from_the_checks_and_a_skipped_check_adds_none():
    policy = {"greedy": {"prompts": 10, "well_formed": 7}, "p_tool_call_first_turn": 0.95, "p_close_after_actions": 0.9}
    user = {"tasks": 20, "request_first": 20, "stop_after_closing": 17, "transfer_after_transfer": 19}
    verdicts = {c.name: c.met for c in criteria(policy, user)}
    assert verdicts == {
        "first_turn_well_formed": False,  # 0.7 < 0.8
        "p_tool_call_first_turn": True,
        "p_close_after_actions": False,  # above the band: a policy that always closes leaves the demo nothing to learn
        "user_request_first": True,
        "user_stop_after_closing": False,  # 0.85 < 0.9
        "user_transfer_after_transfer": True,
    }
    assert criteria({}, {}) == []
    assert Criterion("x", 0.15, 0.15, 0.85).met and not Criterion("x", 0.149, 0.15, 0.85).met


def test_the_checks_read_the_decisions_at_the_demo_temperature():
    demo = yaml.safe_load((ROOT / "specs/demo.yaml").read_text())
    assert demo["spec"]["policy"]["rollout"]["train"]["temperature"] == CHECK_TEMPERATURE


def test_prefix_cache_gives_the_full_forward_results():
    """Reading the decision from a cached system prompt equals running the whole prompt (a random tiny model)."""
    import torch

    from longhaul.tiny.checks import PrefixCache
    from longhaul.tiny.models import POLICY_ARCH, build_model
    from longhaul.tiny.warmstart import shared_prefix

    model = build_model(POLICY_ARCH, vocab_size=128, eos_token_id=1, pad_token_id=0, seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    system = torch.randint(2, 128, (300,), generator=gen).tolist()
    prompts = [system + torch.randint(2, 128, (n,), generator=gen).tolist() for n in (5, 40, 17)]
    prefix = PrefixCache(model, shared_prefix(prompts))
    assert prefix.ids == system
    for ids in prompts:
        with torch.no_grad():
            full = model(input_ids=torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(prefix.last_logits(model, ids), full, rtol=1e-4, atol=1e-4)
    assert not prefix.covers(system) and shared_prefix([[1, 2, 3], [1, 2, 3]]) == [1, 2]
