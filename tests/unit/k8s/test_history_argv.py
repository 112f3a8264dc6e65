"""`longhaul history NAME` checks NAME (and --namespace) before kubectl runs: a value such as `--server=…` or `-h`
would be read by kubectl as one of its options (#30). Through the real CLI, with a kubectl that records its argv."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture()
def kubectl(tmp_path):
    log = tmp_path / "argv.jsonl"
    exe = tmp_path / "kubectl"
    exe.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "print(json.dumps({'status': {'history': []}}))\n"
    )
    exe.chmod(0o755)
    return exe, log


def _history(kubectl, *args):
    env = {**os.environ, "LONGHAUL_KUBECTL": str(kubectl[0])}
    return subprocess.run(
        [sys.executable, "-m", "longhaul.cli", "history", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--", "--server=https://attacker.example"],
        ["--", "-h"],
        ["--", "--kubeconfig=/etc/shadow"],
        ["smoke\n"],
        ["Smoke"],
        ["smoke", "--namespace", "--token=stolen"],
        ["smoke", "-n", "default\n"],
    ],
)
def test_a_name_that_kubectl_would_read_as_an_option_is_refused_before_kubectl_runs(kubectl, args):
    res = _history(kubectl, *args)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "is not a Kubernetes name" in out, out
    assert "Traceback" not in out
    assert not kubectl[1].exists(), kubectl[1].read_text()


def test_a_valid_name_reaches_kubectl_as_one_positional_word(kubectl):
    res = _history(kubectl, "smoke", "-n", "team-a")
    assert res.returncode == 0, res.stdout + res.stderr
    (argv,) = [json.loads(line) for line in kubectl[1].read_text().splitlines()]
    assert argv[:3] == ["get", "experiments.longhaul.dev", "smoke"] and argv[argv.index("--namespace") + 1] == "team-a"
