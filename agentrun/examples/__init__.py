"""Example agents, loaded only when named in AGENTRUN_AGENT_MODULES (see the README)."""
