"""veRL agent loop for τ² airline: the same episode runner as evaluation, inside veRL rollouts.

`longhaul.agentloop.config` (pure) renders the `agent_loop_config_path` YAML; `longhaul.agentloop.loop` holds the
`ToolAgentLoop` subclass (imports veRL).
"""
