"""How the CPU policy server picks up new weights: in-place reload vs restart, measured side by side.

Starts the vLLM-CPU policy server of specs/smoke.yaml on the tiny policy (needs `make install` and
`longhaul tiny build`), then serves a second copy of the weights (a) in place (`/collective_rpc reload_weights`,
what the launcher does) and (b) by restarting the server, and prints both times and their ratio. It also checks
that the reloaded server answers with the new weights (greedy output of a perturbed copy differs).

    python benchmarks/bench_serve_weights.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from longhaul.launcher.servers import PolicyServer
    from longhaul.render.plan import render_plan
    from longhaul.spec import load_spec

    vllm_python = os.environ.get("LONGHAUL_VLLM_PYTHON", sys.executable)
    exp = load_spec(ROOT / "specs" / "smoke.yaml")
    base = ROOT / exp.spec.policy.model.path
    if not Path(vllm_python).exists() or not (base / "config.json").exists():
        print("needs `make install` and `longhaul tiny build`", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    a, b = work / "a", work / "b"
    shutil.copytree(base, a)
    shutil.copytree(base, b)
    model = AutoModelForCausalLM.from_pretrained(b, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    model.save_pretrained(b)
    plan = render_plan(exp, "local", str(work / "run"), server_python=vllm_python)
    plan_server = plan.policy_server
    server = PolicyServer(plan_server, {**os.environ, **plan.env}, work / "logs", echo=open(os.devnull, "w"))
    url = f"http://{plan_server.host}:{plan_server.port}/v1/completions"

    def greedy() -> str:
        r = httpx.post(
            url,
            json={
                "model": plan_server.served_model_name,
                "prompt": "I want to cancel",
                "max_tokens": 12,
                "temperature": 0,
            },
            timeout=300,
        )
        return r.json()["choices"][0]["text"]

    try:
        t0 = time.monotonic()
        server.serve_weights(a, "a")
        start = time.monotonic() - t0
        out_a = greedy()
        reload_s = server.serve_weights(b, "b")
        out_b = greedy()
        server.reload_in_place = False
        restart_s = server.serve_weights(a, "a again")
        out_a2 = greedy()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"first start-up        {start:8.1f} s")
    print(f"in-place reload       {reload_s:8.1f} s   ({server.updates[1]['how']})")
    print(f"restart               {restart_s:8.1f} s   ({server.updates[2]['how']})")
    print(f"restart / reload      {restart_s / max(reload_s, 1e-9):8.1f} x")
    print(f"reloaded weights used: {out_a != out_b}; restart restores the original output: {out_a == out_a2}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
