"""What veRL needs to run the longhaul agent loop: the `agent_loop_config_path` YAML and the Hydra overrides.

Pure: no I/O. The renderer writes `render_agent_loop_yaml(exp)` to a file next to the run's other rendered
files and passes `agent_loop_overrides(path)` to veRL.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import yaml

from longhaul import constants as C
from longhaul.envs.limits import EpisodeLimits
from longhaul.rewards.combine import RewardSettings

#: The name rows select with their `agent_name` column (and the default agent loop).
AGENT_LOOP_NAME = "longhaul_airline"
#: Importable class veRL instantiates (Hydra `_target_`).
AGENT_LOOP_TARGET = "longhaul.agentloop.loop.LonghaulAirlineAgentLoop"
#: veRL's v1 replay buffer replacements that drop failed groups whole and count them (`longhaul.agentloop.sampler`):
#: one for veRL's sync trainer, one for its async trainers (colocate_async, separate_async).
SAMPLER_PATH = "pkg://longhaul.agentloop.sampler"
SAMPLER_NAME = "LonghaulReplayBuffer"
ASYNC_SAMPLER_NAME = "LonghaulReplayBufferAsync"
#: A step whose failed groups outnumber the groups it trains on stops the run: the user simulator (or the prompt
#: budget) is broken, and refilling would only consume the dataset.
MAX_FAILED_FRACTION = 0.5


def _v(x: Any) -> Any:
    return getattr(x, "value", x)


def build_loop_settings(exp: Any) -> dict[str, Any]:
    """The keyword arguments of `LonghaulAirlineAgentLoop` for an Experiment: episode limits, reward and
    user-simulator settings, all taken from the spec (no defaults of its own)."""
    spec = exp.spec if hasattr(exp, "spec") else exp
    sim = spec.user_simulator
    if _v(sim.placement) == "external":
        base_url = sim.url
    else:
        base_url = f"http://127.0.0.1:{sim.port}/v1"
    return {
        # The episode runner's own limits (the loop rebuilds `EpisodeLimits(**limits)`): one list of limits.
        "limits": asdict(EpisodeLimits.from_spec(spec)),
        "reward": RewardSettings.from_spec(spec).to_dict(),
        "user_simulator": {
            "base_url": base_url,
            "model": sim.model.name,
            "temperature": sim.sampling.temperature,
            "top_p": sim.sampling.top_p,
            "max_tokens": sim.sampling.max_tokens,
            "api_key_env": C.ENV_USER_SIM_API_KEY if sim.api_key_secret is not None else None,
        },
    }


def render_agent_loop_yaml(exp: Any) -> str:
    """File content for `actor_rollout_ref.rollout.agent.agent_loop_config_path`: one entry, `longhaul_airline`."""
    entry = {"name": AGENT_LOOP_NAME, "_target_": AGENT_LOOP_TARGET, **build_loop_settings(exp)}
    return yaml.safe_dump([entry], sort_keys=False, allow_unicode=True)


#: Importable BaseTool class that declares each airline tool to veRL's registry.
TOOL_CLASS = "longhaul.agentloop.tools.AirlineTool"


def render_tool_config_yaml(exp: Any) -> str:
    """File content for `actor_rollout_ref.rollout.multi_turn.tool_config_path`: the 14 airline tools with their
    OpenAI schemas (the same list the episode runner gives the policy). `exp` is accepted for symmetry; the tool
    set does not depend on the spec."""
    # deferred: the airline tools (~10 ms): `validate` renders the launch plan through this module
    from longhaul.envs.airline.tools import tool_schemas

    tools = [
        {"class_name": TOOL_CLASS, "config": {"type": "native"}, "tool_schema": schema} for schema in tool_schemas()
    ]
    return yaml.safe_dump({"tools": tools}, sort_keys=False, allow_unicode=True)


def sampler_name(trainer_mode: str) -> str:
    """The longhaul replay buffer class for `trainer.v1.trainer_mode`: the sync one for `sync`, the async one for
    every other mode (as veRL picks its own buffer: trainer/ppo/v1/trainer_base.py `_build_replay_buffer`)."""
    return SAMPLER_NAME if trainer_mode == "sync" else ASYNC_SAMPLER_NAME


def sampler_overrides(exp: Any) -> list[str]:
    """The veRL Hydra overrides that make a failed trajectory drop its whole group, refill it with a fresh prompt
    and count it (`longhaul.agentloop.sampler`): the sampler class for the trainer mode and its settings (group
    size, the failed fraction that stops the run).

    Sync also gets `sync_refill_failed_groups=true`, which makes veRL's dataloader fetch one prompt at a time, as
    exact refills need. The async modes do not: their dataloader always fetches one prompt at a time
    (trainer_base.py `_init_dataloader`), and veRL gives a custom sampler none of its built-in options
    (`_build_replay_buffer`), so the flag would do nothing there."""
    spec = exp.spec if hasattr(exp, "spec") else exp
    name = sampler_name(_v(spec.algorithm.trainer.mode))
    refill = ["trainer.v1.sampler.sync_refill_failed_groups=true"] if name == SAMPLER_NAME else []
    return [
        f"trainer.v1.sampler.custom_sampler.path={SAMPLER_PATH}",
        f"trainer.v1.sampler.custom_sampler.name={name}",
        *refill,
        f"+trainer.v1.sampler.sampler_kwargs.rollout_n={spec.algorithm.group_size}",
        f"+trainer.v1.sampler.sampler_kwargs.max_failed_fraction={MAX_FAILED_FRACTION}",
    ]
