"""The agents and tools that ship with agentrun, registered on import.

`scripted` takes its decisions from the run input (any behaviour without a model), `shop` is
the demo's agent with side effects and an approval, `llm` an agent over any OpenAI-compatible
chat API, and `tools` the test tools whose side effects land in tables the tests count.
"""

from agentrun.builtin import llm, scripted, shop, tools  # noqa: F401
