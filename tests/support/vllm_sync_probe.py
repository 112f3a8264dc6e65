"""Test probe, loaded in every veRL process through VERL_USE_EXTERNAL_MODULES=vllm_sync_probe (with tests/support on
PYTHONPATH). At each weight sync into veRL's vLLM rollout, the trainer's sender appends to the JSON-lines file
$LONGHAUL_TEST_SYNC_LOG the sum (float64) of every tensor it sent, by name (side "actor"), and the vLLM worker
appends what it now serves (side "rollout") — the sum (float64) and element count of every parameter, by vLLM's
parameter name, and for a LoRA adapter sync the sum of the adapter tensors vLLM received (`add_lora`) — so a test
can compare what is served with the actor's checkpoint of the same step.

Test-only: it wraps veRL's `vLLMColocateWorkerExtension.update_weights_from_ipc` (the method veRL's sync calls in
the vLLM worker) through longhaul's import hook; the product never loads it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from longhaul.verlcpu.hooks import after_import

ENV_LOG = "LONGHAUL_TEST_SYNC_LOG"
_SUPPORT = Path(__file__).resolve().parent


def sync_probe_env(log: Path) -> dict[str, str]:
    """Environment that loads this probe in every veRL process of a run (vLLM's workers inherit it)."""
    path = os.pathsep.join(p for p in (str(_SUPPORT), os.environ.get("PYTHONPATH", "")) if p)
    return {"VERL_USE_EXTERNAL_MODULES": Path(__file__).stem, "PYTHONPATH": path, ENV_LOG: str(log)}


@dataclass(frozen=True)
class Sync:
    """One side of one weight sync: parameter sums by name; for the rollout, the adapter sum it received."""

    params: dict[str, float]
    adapter: float | None = None

    @property
    def names(self) -> list[str]:
        return list(self.params)

    @property
    def weights(self) -> float:
        return sum(self.params.values())

    def weights_without_tied_head(self, model_dir: Path) -> float:
        """The sum without `lm_head.weight` when the model ties it to the input embedding (vLLM holds it once)."""
        tied = json.loads((Path(model_dir) / "config.json").read_text()).get("tie_word_embeddings", False)
        return sum(v for k, v in self.params.items() if not (tied and k.endswith("lm_head.weight")))


def weights_sum(model_dir: Path) -> float:
    """Sum (float64) of every tensor stored in a model directory: what vLLM serves when it holds exactly these
    weights (a tied lm_head is stored once and served once)."""
    from safetensors import safe_open

    total = 0.0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            total += sum(float(st.get_tensor(k).double().sum()) for k in st.keys())
    return total


def read_sync_log(log: Path) -> tuple[list[Sync], list[Sync]]:
    """(what the actor sent, what the rollout then served), one entry per sync, in order."""
    records = [json.loads(line) for line in Path(log).read_text().splitlines()]
    sent = [Sync(r["params"]) for r in records if r["side"] == "actor"]
    served = [Sync({k: v[0] for k, v in r["params"].items()}, r["lora_sum"]) for r in records if r["side"] == "rollout"]
    return sent, served


def _record(side: str, params: dict, **extra) -> None:
    """Append one side of one sync to the log."""
    record = {"side": side, "pid": os.getpid(), "time": time.time(), "params": params, **extra}
    with open(os.environ[ENV_LOG], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _served(model) -> dict[str, list[float]]:
    import torch

    with torch.no_grad():
        return {name: [float(p.double().sum()), p.numel()] for name, p in model.named_parameters()}


def _wrap(utils) -> None:
    ext = utils.vLLMColocateWorkerExtension
    if getattr(ext.update_weights_from_ipc, "probe", False):
        return
    update, load = ext.update_weights_from_ipc, ext._update_weights

    def _update_weights(self, weights, peft_config, base_sync_done):
        if peft_config and base_sync_done:  # an adapter: every tensor of it arrives in this one call
            pairs = weights.items() if isinstance(weights, dict) else weights
            self._probe_lora = (getattr(self, "_probe_lora", None) or 0.0) + sum(
                float(t.double().sum()) for _n, t in pairs
            )
        return load(self, weights, peft_config, base_sync_done)

    def update_weights_from_ipc(self, *args, **kwargs):
        self._probe_lora = None
        out = update(self, *args, **kwargs)
        _record("rollout", _served(self.model_runner.model), lora_sum=self._probe_lora)
        return out

    update_weights_from_ipc.probe = True
    ext.update_weights_from_ipc = update_weights_from_ipc
    ext._update_weights = _update_weights


def _wrap_sender(bwt) -> None:
    sender = bwt.BucketedWeightSender
    if getattr(sender.async_send_weights, "probe", False):
        return
    send = sender.async_send_weights

    async def async_send_weights(self, weights):
        sums: dict[str, float] = {}

        def counted():
            for name, tensor in weights:
                sums[name] = sums.get(name, 0.0) + float(tensor.detach().double().sum())
                yield name, tensor

        out = await send(self, counted())
        _record("actor", sums)
        return out

    async_send_weights.probe = True
    sender.async_send_weights = async_send_weights


if os.environ.get(ENV_LOG):
    after_import("verl.workers.rollout.vllm_rollout.utils", _wrap)
    after_import("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer", _wrap_sender)
