"""Built-in tools and agents, registered on import."""

from agentrun.builtin import llm, scripted, shop, tools  # noqa: F401
