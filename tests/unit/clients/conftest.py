from support.openai_stub import openai_stub  # noqa: F401  (the scripted OpenAI-compatible server fixture)
