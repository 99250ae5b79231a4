"""Moving the test database along the migration graph, for the tests of a data migration."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def leaves() -> list[tuple[str, str]]:
    """The migrations the code is at (the graph's leaves)."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes("agentrun")


def migrate(targets: list[tuple[str, str]]) -> Any:
    """Migrate (forwards or back) to `targets`; the historical apps as they stand there."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps
