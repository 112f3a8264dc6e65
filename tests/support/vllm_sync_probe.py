"""Test probe, loaded in every veRL process through VERL_USE_EXTERNAL_MODULES=vllm_sync_probe (with tests/support on
PYTHONPATH): after each weight sync into veRL's vLLM rollout, the vLLM worker appends what it now serves to the
JSON-lines file $LONGHAUL_TEST_SYNC_LOG — the sum (float64) and element count of every parameter, by vLLM's
parameter name — so a test can compare the served weights with the actor's checkpoint of the same step.

Test-only: it wraps veRL's `vLLMColocateWorkerExtension.update_weights_from_ipc` (the method veRL's sync calls in
the vLLM worker) through longhaul's import hook; the product never loads it.
"""

from __future__ import annotations

import json
import os
import time

from longhaul.verlcpu.hooks import after_import

ENV_LOG = "LONGHAUL_TEST_SYNC_LOG"


def _served(model) -> dict[str, list[float]]:
    import torch

    with torch.no_grad():
        return {name: [float(p.double().sum()), p.numel()] for name, p in model.named_parameters()}


def _wrap(utils) -> None:
    ext = utils.vLLMColocateWorkerExtension
    if getattr(ext.update_weights_from_ipc, "probe", False):
        return
    update = ext.update_weights_from_ipc

    def update_weights_from_ipc(self, *args, **kwargs):
        out = update(self, *args, **kwargs)
        record = {"pid": os.getpid(), "time": time.time(), "params": _served(self.model_runner.model)}
        with open(os.environ[ENV_LOG], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        return out

    update_weights_from_ipc.probe = True
    ext.update_weights_from_ipc = update_weights_from_ipc


if os.environ.get(ENV_LOG):
    after_import("verl.workers.rollout.vllm_rollout.utils", _wrap)
