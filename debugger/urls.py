from django.urls import path, re_path, register_converter

from debugger import saved, views


class BoundaryConverter:
    """pre | post: which side of a step a snapshot was taken."""

    regex = "pre|post"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(BoundaryConverter, "at")

app_name = "debugger"
urlpatterns = [
    path("", views.run_list, name="run-list"),
    # Saved views: an operator's named filters of the run list.
    path("views/", saved.save_view, name="view-save"),
    path("views/<int:view_id>/delete/", saved.delete_view, name="view-delete"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/live/", views.run_live, name="run-live"),
    path("runs/<uuid:run_id>/cancel/", views.cancel_run, name="run-cancel"),
    path("runs/<uuid:run_id>/retry/", views.retry_step, name="run-retry"),
    path("runs/<uuid:run_id>/approval/", views.decide, name="run-approval"),
    path("runs/<uuid:run_id>/compare/", views.compare_runs, name="run-compare"),
    path("runs/<uuid:run_id>/watch/", views.watch_value, name="run-watch"),
    path("runs/<uuid:run_id>/steps/<int:number>/", views.run_detail, name="run-step"),
    path("runs/<uuid:run_id>/steps/<int:number>/diff/", views.step_diff, name="step-diff"),
    path(
        "runs/<uuid:run_id>/steps/<int:number>/request/",
        views.model_request,
        name="step-request",
    ),
    path("runs/<uuid:run_id>/steps/<int:number>/<at:at>/", views.snapshot, name="snapshot"),
    path("runs/<uuid:run_id>/steps/<int:number>/<at:at>/fork/", views.fork, name="run-fork"),
    path(
        "runs/<uuid:run_id>/steps/<int:number>/<at:at>/fork/check/",
        views.fork_check,
        name="run-fork-check",
    ),
    path(
        "runs/<uuid:run_id>/steps/<int:number>/<at:at>.json",
        views.snapshot_json,
        name="snapshot-json",
    ),
    path("runs/<uuid:run_id>/input.json", views.run_input_json, name="run-input-json"),
    path("runs/<uuid:run_id>/input/", views.run_input, name="run-input"),
    path("runs/<uuid:run_id>/export/", views.run_export, name="run-export"),
    path("now/", views.now, name="now"),
    # Replay batches: the runs a filter selects, forked again together.
    path("batches/", views.batch_list, name="batch-list"),
    path("batches/new/", views.batch_new, name="batch-new"),
    path("batches/<uuid:batch_id>/", views.batch_detail, name="batch-detail"),
    path("batches/<uuid:batch_id>/cancel/", views.batch_cancel, name="batch-cancel"),
    path("batches/<uuid:batch_id>/promote/", views.batch_promote, name="batch-promote"),
    path("diff/", views.diff_any, name="diff"),
    path("audit/", views.audit, name="audit"),
    path("audit/export.csv", views.audit_csv, name="audit-csv"),
    # Pins: runs kept from retention.
    path("runs/<uuid:run_id>/pin/", views.pin_run, name="run-pin"),
    path("runs/<uuid:run_id>/unpin/", views.unpin_run, name="run-unpin"),
    # A short run id (not a whole UUID, which the paths above take): redirected to the run.
    re_path(
        r"^runs/(?P<prefix>[0-9a-fA-F-]{1,36})/(?P<rest>.*)$",
        views.run_by_short_id,
        name="run-short-id",
    ),
]
