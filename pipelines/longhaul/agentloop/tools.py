"""veRL tool registrations for the 14 airline tools (`multi_turn.tool_config_path`).

The tools run inside `LonghaulAirlineAgentLoop`'s episode runner, against the episode's private database copy;
these classes only declare them to veRL (schemas for its tool registry and traces). Executing one through
veRL's stock `tool_agent` loop would bypass the environment and the grading, so it fails loudly instead.
"""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool


class AirlineTool(BaseTool):
    """Declaration of one τ² airline tool for veRL's registry; execution happens in the longhaul agent loop."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):  # noqa: D102
        raise RuntimeError(
            f"airline tool '{self.name}' was called by a veRL agent loop other than longhaul_airline; the airline "
            "tools execute inside LonghaulAirlineAgentLoop (set actor_rollout_ref.rollout.agent.default_agent_loop="
            "longhaul_airline, or the dataset's agent_name column, to longhaul_airline)"
        )
