"""Example agents for users to copy: the README's own-agent example lives here.

They are loaded only when named in AGENTRUN_AGENT_MODULES, like a user's own module.
"""
