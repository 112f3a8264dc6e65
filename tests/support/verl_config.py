"""Compose veRL 0.9.1's real `ppo_trainer` Hydra config with our overrides and run its `validate_config`.

One check inside `validate_config` (the LoRA-rank check for vLLM) imports
`verl.workers.rollout.vllm_rollout.utils`, whose module imports vLLM, which cannot be installed beside veRL's
CPU stack. For that single function we execute veRL's own source of `get_vllm_max_lora_rank` (extracted
with `ast` from the installed file, unchanged) in a module registered under the same name, so the check
runs veRL's real code path — the branch veRL itself takes when vLLM's `MaxLoRARanks` cannot be imported.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import types
from typing import Any, Literal, get_args

_SHIM = "verl.workers.rollout.vllm_rollout.utils"


def _install_lora_rank_check() -> None:
    if _SHIM in sys.modules:
        return
    import verl

    path = os.path.join(os.path.dirname(verl.__file__), "workers", "rollout", "vllm_rollout", "utils.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_vllm_max_lora_rank")
    module = types.ModuleType(_SHIM)
    module.__dict__.update({"Literal": Literal, "get_args": get_args})
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), module.__dict__)
    if importlib.util.find_spec("vllm") is None:
        sys.modules[_SHIM] = module


def compose_verl(overrides: list[str], config_name: str = "ppo_trainer") -> Any:
    """Compose veRL's packaged config with `overrides` (Hydra compose API)."""
    import verl
    from hydra import compose, initialize_config_dir

    cfgdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfgdir, version_base=None):
        return compose(config_name, overrides=overrides)


def validate_verl(overrides: list[str]) -> Any:
    """Compose and run veRL's `validate_config`; returns the config or raises veRL's own error."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    _install_lora_rank_check()
    cfg = compose_verl(overrides)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg
