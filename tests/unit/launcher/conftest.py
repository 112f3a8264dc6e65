"""Shared fixture of the launcher tests: a smoke spec on free ports and a fake vLLM server python."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from support.net import free_port

ROOT = Path(__file__).resolve().parents[3]
FAKE = Path(__file__).with_name("fake_vllm.py")


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    """A smoke spec on free ports, a fake server python (tests/unit/launcher/fake_vllm.py) and an environment for
    launch(): `{spec, env, log, run_dir, calls, doc, monkeypatch, tmp}`."""
    doc = yaml.safe_load((ROOT / "specs" / "smoke.yaml").read_text())
    doc["spec"]["user_simulator"]["port"] = free_port()
    doc["spec"]["backends"].setdefault("local", {})["policy_port"] = free_port()
    doc["spec"]["user_simulator"]["startup_timeout_s"] = 30
    spec = tmp_path / "smoke.yaml"
    spec.write_text(yaml.safe_dump(doc))
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    log = tmp_path / "fake.jsonl"
    env = {**os.environ, "LONGHAUL_VLLM_PYTHON": str(wrapper), "FAKE_VLLM_LOG": str(log)}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("LONGHAUL_RUN_NAME", None)
    calls: list[str] = []
    return {
        "spec": spec,
        "env": env,
        "log": log,
        "run_dir": tmp_path / "run",
        "calls": calls,
        "doc": doc,
        "monkeypatch": monkeypatch,
        "tmp": tmp_path,
    }
