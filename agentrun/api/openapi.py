"""The OpenAPI 3.1 document of the JSON API, served at /api/openapi.json.

Nothing here is written by hand: Django Ninja generates it from the operations
declared in agentrun.api.operations and the models in agentrun.api.schemas.
"""

from __future__ import annotations

from typing import Any


def document() -> dict[str, Any]:
    from agentrun.api.operations import api

    return api.document()
