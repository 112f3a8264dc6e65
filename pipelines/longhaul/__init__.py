"""longhaul: declarative GRPO training of long-horizon, multi-turn, tool-using LLM agents."""

__version__ = "0.1.0"
