"""Environments for episodes: the τ²-bench airline domain, the trajectory records and the shared runner."""
