"""Clients for OpenAI-compatible chat endpoints (what vLLM serves): the policy and the user simulator."""
