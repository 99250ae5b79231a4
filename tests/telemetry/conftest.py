# Real workers and the named people's clients, as the runtime's and dashboard's tests have them.
from tests.agentrun.conftest import people, start_worker  # noqa: F401
from tests.debugger.conftest import client_for  # noqa: F401
