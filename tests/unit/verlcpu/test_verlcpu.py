"""veRL's CPU platform (longhaul.verlcpu): activation through veRL's registries, the guarded patches, and the
CPU rollout server's contract (temperature-scaled log-probs, stops, budgets, weight sync).

The full trainer path (`main_ppo` on this platform) runs in tests/e2e/demo and tests/e2e/verl.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.verl

ROOT = Path(__file__).resolve().parents[3]


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_import_verl_activates_the_cpu_platform_only_when_selected() -> None:
    """`import verl` loads the plugin through the verl.plugins entry point in every process; with
    VERL_PLATFORM=cpu everything is registered, without it nothing is (a GPU job is unaffected)."""
    probe = (
        "import json, verl\n"
        "from verl.plugin.platform.platform_manager import PlatformRegistry\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "from verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"
        "from verl.workers.engine.base import EngineRegistry\n"
        "import verl.workers.engine.fsdp.transformer_impl as ti\n"
        "from longhaul.verlcpu import plugin\n"
        "out = {'platforms': list(PlatformRegistry.registered_names()),\n"
        "       'rollouts': list(RolloutReplicaRegistry._registry),\n"
        "       'adapter': _ROLLOUT_REGISTRY.get(('longhaul_cpu', 'async')),\n"
        "       'engine': 'cpu' in EngineRegistry._engines['language_model']['fsdp2'],\n"
        "       'unpinned': getattr(ti.CPUOffloadPolicy, 'longhaul_unpinned', False),\n"
        "       'error': plugin.ACTIVATION_ERROR}\n"
        "if out['platforms'] and 'cpu' in out['platforms']:\n"
        "    from verl.plugin.platform import get_platform\n"
        "    p = get_platform(); out['device'] = p.device_name; out['backend'] = p.ray_resource_name()\n"
        "print(json.dumps(out))\n"
    )
    on = _run_python(probe, VERL_PLATFORM="cpu")
    assert on.returncode == 0, on.stderr[-3000:]
    got = json.loads(on.stdout.strip().splitlines()[-1])
    assert got["error"] is None
    assert "cpu" in got["platforms"] and got["device"] == "cpu" and got["backend"] == "GPU"
    assert "longhaul_cpu" in got["rollouts"] and got["adapter"] == "longhaul.verlcpu.rollout.CPUServerAdapter"
    assert got["engine"] and got["unpinned"]

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert off.returncode == 0, off.stderr[-3000:]
    got = json.loads(off.stdout.strip().splitlines()[-1])
    assert "cpu" not in got["platforms"] and got["adapter"] is None and not got["engine"] and not got["unpinned"]


def test_every_guard_passes_on_the_pinned_verl() -> None:
    from longhaul.verlcpu import patches

    assert patches.check_verl_version() == "0.9.1"
    patches.check_process_group_order()
    patches.check_resource_accounting()


def test_guards_fail_loudly_when_verl_changes(monkeypatch) -> None:
    """Each patch refuses to run against code that no longer looks as it was written against."""
    import verl
    import verl.workers.engine.fsdp.transformer_impl as ti
    from verl.workers.rollout import base

    from longhaul.verlcpu import patches

    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(patches.VeRLChanged, match="0.9.1"):
        patches.check_verl_version()

    monkeypatch.setattr(base, "_ROLLOUT_REGISTRY", {})
    with pytest.raises(patches.VeRLChanged, match="_ROLLOUT_REGISTRY"):
        patches.register_rollout_adapter()

    monkeypatch.setattr(ti, "CPUOffloadPolicy", None)
    with pytest.raises(patches.VeRLChanged, match="transformer_impl"):
        patches.unpin_forward_only_offload()

    import inspect

    real_getsource = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: "def f():\n    pass\n")
    with pytest.raises(patches.VeRLChanged, match="distributed"):
        patches.check_process_group_order()
    with pytest.raises(patches.VeRLChanged, match="GPU"):
        patches.check_resource_accounting()
    monkeypatch.setattr(inspect, "getsource", real_getsource)


def test_unpinned_policy_keeps_torch_semantics() -> None:
    """Patch 2 only turns pinning off: the engine's policy is still torch's CPUOffloadPolicy."""
    import verl.workers.engine.fsdp.transformer_impl as ti
    from torch.distributed.fsdp import CPUOffloadPolicy

    from longhaul.verlcpu import patches

    patches.unpin_forward_only_offload()
    policy = ti.CPUOffloadPolicy(pin_memory=True)
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False
    patches.unpin_forward_only_offload()  # idempotent: no subclass of the subclass
    assert ti.CPUOffloadPolicy.__mro__[1] is CPUOffloadPolicy


def test_sample_token_reports_temperature_scaled_log_probs() -> None:
    from longhaul.verlcpu.rollout import sample_token

    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    gen = torch.Generator().manual_seed(0)
    for temperature in (0.3, 1.0, 1.7):
        tok, lp = sample_token(logits, temperature, -1, 1.0, gen)
        assert lp == pytest.approx(float(torch.log_softmax(logits / temperature, -1)[tok]), abs=1e-6)
    tok, lp = sample_token(logits, 0.0, -1, 1.0, gen)  # greedy: raw distribution
    assert tok == 0 and lp == pytest.approx(float(torch.log_softmax(logits, -1)[0]), abs=1e-6)
    # top-k 1 and a tiny top-p both leave only the best token.
    assert {sample_token(logits, 1.0, 1, 1.0, gen)[0] for _ in range(20)} == {0}
    assert {sample_token(logits, 1.0, -1, 0.01, gen)[0] for _ in range(20)} == {0}
    # Sampling follows the distribution: at T = 1 token 3 (p ≈ 0.03) is rare, token 0 (p ≈ 0.6) common.
    draws = [sample_token(logits, 1.0, -1, 1.0, gen)[0] for _ in range(2000)]
    assert 0.5 < draws.count(0) / 2000 < 0.7 and draws.count(3) / 2000 < 0.07


@pytest.fixture(scope="module")
def tiny_policy() -> Path:
    path = ROOT / ".cache" / "longhaul" / "models" / "tiny-policy"
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} is missing: run `longhaul tiny build` (make tiny)")
    return path


def _server(path: Path, response_length: int = 32):
    from longhaul.verlcpu.rollout import CPUGenerationServer

    config = SimpleNamespace(prompt_length=4096, response_length=response_length, seed=3)
    return CPUGenerationServer(config, SimpleNamespace(local_path=str(path), path=str(path)), replica_rank=0)


async def test_generation_log_probs_match_a_teacher_forced_forward(tiny_policy) -> None:
    """What veRL's actor recomputes (log_softmax(logits / T) over the whole sequence) equals what the rollout
    reported token by token."""
    server = _server(tiny_policy)
    prompt = list(range(10, 60))
    out = await server.generate(
        "r1", prompt, {"temperature": 0.3, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 12}
    )
    assert 1 <= len(out.token_ids) <= 12 and len(out.log_probs) == len(out.token_ids)
    ids = torch.tensor([prompt + out.token_ids])
    with torch.inference_mode():
        logits = server.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits / 0.3, -1).gather(1, torch.tensor(out.token_ids).unsqueeze(1)).squeeze(1)
    assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)
    assert out.extra_fields["global_steps"] is None and out.extra_fields["weight_version"] == 0


async def test_stops_and_budgets(tiny_policy) -> None:
    server = _server(tiny_policy, response_length=8)
    greedy = {"temperature": 0.0, "logprobs": True}
    first = await server.generate("a", [5, 6, 7], {**greedy, "max_tokens": 4})
    assert len(first.token_ids) <= 4
    # A stop token ends the generation, and is the last token.
    stop = first.token_ids[1] if len(first.token_ids) > 1 else first.token_ids[0]
    stopped = await server.generate("b", [5, 6, 7], {**greedy, "max_tokens": 4, "stop_token_ids": [stop]})
    assert stopped.token_ids[-1] == stop and stopped.stop_reason == "completed"
    # Without max_tokens the response budget (response_length) bounds the generation.
    long = await server.generate("c", [5, 6, 7], {**greedy, "stop_token_ids": []})
    assert len(long.token_ids) <= 8
    # No room left in the context: an empty answer, never an error.
    full = await server.generate("d", list(range(4096 + 8)), greedy)
    assert full.token_ids == [] and full.log_probs == []


async def test_weight_sync_changes_the_served_policy_and_refuses_a_partial_state(tiny_policy) -> None:
    server = _server(tiny_policy)
    prompt = list(range(20, 40))
    greedy = {"temperature": 0.0, "logprobs": True, "max_tokens": 4}
    before = await server.generate("x", prompt, greedy)
    state = {k: v.clone() for k, v in server.model.state_dict().items()}
    head = next(k for k in state if k.endswith("embed_tokens.weight"))
    state[head] = state[head] * 0.0 + torch.randn_like(state[head])
    result = server.load_weights(state, global_steps=3)
    assert result["weight_version"] == 1 and result["global_steps"] == 3
    after = await server.generate("y", prompt, greedy)
    assert after.log_probs != before.log_probs and after.extra_fields["global_steps"] == 3
    partial = {k: v for k, v in state.items() if "layers.0." not in k}
    with pytest.raises(RuntimeError, match="missing"):
        server.load_weights(partial, global_steps=4)
