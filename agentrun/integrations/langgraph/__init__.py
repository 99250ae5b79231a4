"""A LangGraph checkpoint saver that stores each thread as an agentrun run.

    from agentrun.integrations.langgraph import AgentrunSaver
    graph = builder.compile(checkpointer=AgentrunSaver())

A thread (and each subgraph namespace of it) is a run, each checkpoint a step whose pre
and post snapshots are the channel values before and after the super-step, decoded to
plain JSON for the debugger. The checkpoint itself is kept as LangGraph's serializer wrote
it, so LangGraph reads back exactly what it stored. Needs `pip install agentrun[langgraph]`.
"""

from agentrun.integrations.langgraph.saver import AgentrunSaver, run_id_for

__all__ = ["AgentrunSaver", "run_id_for"]
