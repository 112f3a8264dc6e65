"""veRL agent loop for τ² airline: the same episode runner as evaluation, inside veRL rollouts.

`longhaul.agentloop.config` (pure) renders the `agent_loop_config_path` YAML and the veRL overrides (agent loop,
failed-group sampler); `longhaul.agentloop.loop` holds the `ToolAgentLoop` subclass (imports veRL);
`longhaul.agentloop.context` (pure) places a trajectory in training (step, group, session, seed);
`longhaul.agentloop.traces` writes one trace line per trajectory; `longhaul.agentloop.sampler` holds veRL's v1
replay buffers (sync and async) dropping failed groups whole and counting them.
"""
