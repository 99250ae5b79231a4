"""Integrations: other frameworks' runs stored as agentrun runs, so the debugger shows them.

`langgraph` is a LangGraph checkpoint saver (the optional extra `agentrun[langgraph]`): each
thread is a run, each checkpoint a step. Nothing in agentrun imports these packages; an
application imports the one it uses.
"""
