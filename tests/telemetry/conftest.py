from tests.agentrun.conftest import start_worker  # noqa: F401 — real workers, as there
