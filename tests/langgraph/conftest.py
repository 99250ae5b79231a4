from tests.debugger.conftest import client_for, people  # noqa: F401 - the debugger's logins
