from django.urls import path

from agentrun import api

# Path parameters are plain strings, validated by the views, so that a bad id
# gets a JSON 404 rather than Django's HTML page.
app_name = "api"
urlpatterns = [
    path("runs", api.runs, name="runs"),
    path("runs/<str:run_id>", api.run_detail, name="run"),
    path("runs/<str:run_id>/snapshots/<str:step>/<str:at>", api.run_snapshot, name="snapshot"),
    path("runs/<str:run_id>/cancel", api.run_cancel, name="cancel"),
    path("runs/<str:run_id>/approve", api.run_approve, name="approve"),
    path("runs/<str:run_id>/fork", api.run_fork, name="fork"),
    path("runs/<str:run_id>/side-effects", api.run_side_effects, name="side_effects"),
    path("inflight", api.in_flight, name="inflight"),
    path("ledger", api.ledger, name="ledger"),
    path("openapi.json", api.openapi_json, name="openapi"),
]
