from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import BooleanField, Exists, OuterRef, QuerySet, Sum, TextField
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Length
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling
from django_htmx.middleware import HtmxDetails

from agentrun.agents import InvalidInput, get_agent
from agentrun.audit import chain as audit_chain
from agentrun.audit import export as audit_export
from agentrun.builtin import llm_requests
from agentrun.engine import inflight
from agentrun.engine.versions import alive_workers, versions_alive
from agentrun.lifecycle import batches, selection, services
from agentrun.lifecycle.runids import RunIdError, resolve_run
from agentrun.models import (
    RETRY_EVENTS,
    Event,
    ReplayBatch,
    Run,
    SavedView,
    Snapshot,
    Step,
    Worker,
)
from agentrun.security.redact import redact
from agentrun.store import watch
from agentrun.store.delta import state_hash
from agentrun.tools import REGISTRY as TOOLS
from debugger import audit as audit_log
from debugger import charts, compare, forks, progress, saved, timeline, versions
from debugger.access import abilities, check, get_batch_for, get_run_for, role_required
from debugger.diffs import SnapshotRef, StateDiff, diff_states
from debugger.forms import (
    BATCH_STARTS,
    FORK_MODES,
    ApprovalForm,
    AuditFilterForm,
    BatchForm,
    CancelForm,
    DiffForm,
    ForkForm,
    NowFilterForm,
    PinForm,
    PromoteForm,
    RunFilterForm,
)
from debugger.jsontree import (
    Path,
    PathError,
    TreeOptions,
    format_path,
    parse_path,
    render_tree,
    resolve,
    run_input_tree,
)
from debugger.search import FIELDS as search_fields
from debugger.search import StepSearchForm
from debugger.states import diff_snapshots, load_states

RUNS_PER_PAGE = 50
AUDIT_PER_PAGE = 50
PHASES = ("idle", "planning", "executing", "reflecting", "waiting", "done", "error")


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _fragment(request: HtmxHttpRequest, target: str) -> bool:
    """An htmx request for one fragment of a page (not a history restore)."""
    return (
        bool(request.htmx)
        and request.htmx.target == target
        and not request.htmx.history_restore_request
    )


def _stop_polling_unless(active: bool, response: HttpResponse) -> HttpResponse:
    if active:
        return response
    stop = HttpResponseStopPolling(response.content)
    stop["Content-Type"] = response["Content-Type"]
    return stop


# --- run list -------------------------------------------------------------------------


@role_required
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    if _fragment(request, "inflight-counts"):
        counts = _inflight_counts()
        response = render(request, "debugger/_inflight_counts.html", counts)
        return _stop_polling_unless(bool(counts["inflight_total"]), response)
    form = RunFilterForm(request.GET)
    chosen = form.filter(Run.objects.select_related("created_by"))
    runs = run_rows(chosen)
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    page.object_list = with_row_facts(list(page.object_list))
    token = hashlib.sha256(
        "|".join(f"{r.pk}:{r.updated_at.timestamp()}" for r in page).encode()
    ).hexdigest()[:16]
    active = any(r.is_active for r in page)
    query = request.GET.copy()
    query["v"] = token
    context = {
        "form": form,
        "page": page,
        "active": active,
        "poll_url": f"{request.path}?{query.urlencode()}",
        "label_filters": form.cleaned_data["label"] if form.is_valid() else [],
        "replay_url": _replay_url(form) if page.paginator.count else "",
        **abilities(request),
    }
    if _fragment(request, "run-rows"):
        if request.GET.get("v") == token and active:
            return HttpResponse(status=204)
        return _stop_polling_unless(active, render(request, "debugger/run_list.html#rows", context))
    query = form.query() if form.is_valid() else None
    context.update(
        _inflight_counts(),
        builtin_views=_builtin_views(query),
        # A triage view's filter, kept when the form narrows it further.
        triage_kept=[
            (k, query[k]) for k in ("repeated", "stuck", "no_worker") if k in (query or {})
        ],
        saved_views=[
            {"view": v, "url": saved.view_url(v.query), "current": v.query == query}
            for v in SavedView.objects.filter(owner=request.user)
        ],
        filter_query=urlencode(query, doseq=True) if query else "",
        known_versions=sorted(set(Worker.objects.values_list("version", flat=True))),
        tools=sorted(TOOLS),
        # What the runs this filter selects used, all of them (not only this page).
        spent=chosen.order_by().aggregate(
            tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), cost_usd=Sum("cost_usd")
        ),
    )
    return render(request, "debugger/run_list.html", context)


def _builtin_views(query: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The triage views every operator has: each a filter of the run list (a link to
    share), with how many runs it selects now."""
    stuck = int(settings.AGENTRUN_WEBHOOK_STUCK_MINUTES) or 60
    views = [
        (
            "Failing repeatedly",
            {"repeated": "24"},
            f"Runs failed in the last 24 hours with an error {selection.REPEATED_RUNS} or "
            "more of them share",
        ),
        (
            f"Stuck > {stuck} min",
            {"stuck": str(stuck)},
            f"Runs not ended and unchanged for more than {stuck} minutes",
        ),
        (
            "Waiting for a worker",
            {"no_worker": "1"},
            "Runs due to run now that no worker holds (none alive, none of their version, "
            "or all busy)",
        ),
    ]
    out = []
    for name, view_query, title in views:
        count = selection.parse(view_query).apply(Run.objects.all()).count()
        url = saved.view_url(view_query)
        out.append(
            {
                "name": name,
                "url": url,
                "count": count,
                "title": title,
                "current": query == view_query,
            }
        )
    return out


def _replay_url(form: RunFilterForm) -> str:
    """The new batch page for the runs the list shows."""
    if not form.is_valid():
        return ""
    query = urlencode(form.query(), doseq=True)
    return reverse("debugger:batch-new") + (f"?{query}" if query else "")


def _inflight_counts() -> dict[str, Any]:
    """The run list header's line: 12 deciding · 30 on a tool · ... (states with runs only)."""
    counts = inflight.counts()
    return {
        "inflight_parts": [(s, counts[s.key]) for s in inflight.STATES if counts[s.key]],
        "inflight_total": sum(counts.values()),
    }


# --- now: what is in flight --------------------------------------------------------------


@role_required
def now(request: HtmxHttpRequest) -> HttpResponse:
    """Every step in flight by state and worker, longest waits first; the body polls."""
    form = NowFilterForm(request.GET)
    context = {
        "form": form,
        "snap": form.snapshot(),
        "states": inflight.STATES,
        "no_worker": inflight.NO_WORKER,
        "max_limit": inflight.MAX_LIMIT,
        "poll_url": request.get_full_path(),
        **_workers_context(),
        **abilities(request),
    }
    if _fragment(request, "now-body"):
        return render(request, "debugger/now.html#body", context)
    return render(request, "debugger/now.html", context)


def _workers_context() -> dict[str, Any]:
    """The live workers with their versions, and the runs none of them will claim."""
    workers = alive_workers()
    waiting, waiting_total = versions.waiting_for_a_worker(workers)
    return {"workers": workers, "waiting": waiting, "waiting_total": waiting_total}


# --- run detail -------------------------------------------------------------------------


@role_required
def run_detail(request: HtmxHttpRequest, run_id: Any, number: int | None = None) -> HttpResponse:
    run = get_run_for(request, run_id)
    if run.purged_at is not None:
        return purged_run(request, run, number)
    if number is not None and _fragment(request, "step-body"):
        step = get_object_or_404(Step, run=run, number=number)
        if request.GET.get("v") == timeline.version(run) and run.is_active:
            return HttpResponse(status=204)
        context = {"run": run, **_step_context(run, step), **abilities(request)}
        response = render(request, "debugger/run_detail.html#step", context)
        return _stop_polling_unless(not context["sv"].finished and run.is_active, response)
    marks = timeline.marks(run)
    found = _search(request, run)
    if found.errors:
        if request.htmx and not request.htmx.history_restore_request:
            return HttpResponse(_search_errors(found), status=400)
    elif _list_page_request(request):
        return _list_page(request, run, marks, found)
    auto = number is None  # the page picks the step: the live refresh may pick again
    if number is None:
        number = _opening_step(run, marks, found)
    elif not any(m.number == number for m in marks):
        raise Http404("no such step")
    context = {**_run_context(request, run, marks, found, number), "selected": number, "auto": auto}
    if _fragment(request, "run-live"):  # the search form: the filtered strip and list
        return _live_response(request, run, context)
    if number is not None:
        context.update(_step_context(run, get_object_or_404(Step, run=run, number=number)))
    return render(request, "debugger/run_detail.html", context, status=400 if found.errors else 200)


@role_required
def run_live(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """What the run page polls while the run is active: header, strip and list, or 204."""
    run = get_run_for(request, run_id)
    if request.GET.get("v") == timeline.version(run) and run.is_active:
        return HttpResponse(status=204)
    marks = timeline.marks(run)
    found = _search(request, run)
    around = request.GET.get("around", "")
    selected = int(around) if around.isascii() and around.isdigit() and len(around) < 10 else None
    # The page's script says when the step shown is the page's own pick, or none (`open`,
    # `shown`), and when the search form is missing (`form=0`: drawn before the run had a
    # step). Then the refresh does what a fresh load would: opens a step once there is one,
    # the opening step again once the run has finished, and brings the search form.
    shown = request.GET.get("shown", "")
    reopen = (
        request.GET.get("open") == "1"
        and bool(marks)
        and not found.errors
        and (not shown or not run.is_active)
    )
    if reopen:
        selected = _opening_step(run, marks, found)
        reopen = selected is not None and str(selected) != shown
    context = _run_context(request, run, marks, found, selected)
    parts = ["steplist"]
    if request.GET.get("form") == "0" and marks:
        parts.append("runsearch")
    if reopen:
        assert selected is not None
        context.update(
            _step_context(run, get_object_or_404(Step, run=run, number=selected)),
            selected=selected,
            auto=True,
        )
        parts.append("step")
    return _live_response(request, run, context, parts)


def _opening_step(run: Run, marks: list[timeline.Mark], found: StepSearchForm) -> int | None:
    hits = found.matches() if found.active else None
    return timeline.opening_step(
        run, marks if hits is None else [m for m in marks if m.number in hits]
    )


def _live_response(
    request: HttpRequest,
    run: Run,
    context: dict[str, Any],
    parts: tuple[str, ...] | list[str] = ("steplist",),
) -> HttpResponse:
    body = render_to_string("debugger/run_detail.html#live", context, request=request)
    for part in parts:
        body += render_to_string(
            f"debugger/run_detail.html#{part}", {**context, "oob": True}, request=request
        )
    return _stop_polling_unless(run.is_active, HttpResponse(body))


def _run_context(
    request: HttpRequest,
    run: Run,
    marks: list[timeline.Mark],
    found: StepSearchForm | None = None,
    selected: int | None = None,
) -> dict[str, Any]:
    found = found if found is not None else StepSearchForm(run)
    matches = found.matches() if found.active else None
    points = timeline.chart_points_of(marks)
    lineage = forks.lineage(run)
    cells = timeline.cells(marks, matches)
    binned = len(marks) > timeline.MAX_CELLS
    step_url = reverse("debugger:run-step", args=[run.pk, 0]).removesuffix("0/")
    return {
        **_list_context(run, marks, found, selected),
        "timeline": marks,
        "total_steps": len(marks),
        "strip": timeline.cells_html(cells, step_url, selected, binned),
        "binned": binned,
        "bin_size": cells[0].count if cells else 1,
        "dense": len(cells) > timeline.DENSE_STRIP,
        "stats": marks.stats() if isinstance(marks, timeline.Marks) else timeline.stats(run),
        "elapsed": timeline.elapsed(run),
        "lineage": lineage,
        "fork_tree": forks.tree(run),
        "fork_event": forks.fork_event(run),
        "waiting_call": timeline.waiting_call(run),
        "duration_chart": charts.duration_bars(points),
        "size_chart": charts.size_line(points),
        "waited_ms": sum(p.backoff_ms + p.wait_ms for p in points),
        "version": timeline.version(run),
        "versions": versions.of_run(run),
        "phases": [p for p in PHASES if p != "waiting"],  # "waiting" is the mark's entry
        "summary": run_summary(run.agent, run.input),
        "cancel_form": CancelForm(),
        **abilities(request),
    }


def _search(request: HttpRequest, run: Run) -> StepSearchForm:
    """The run page's search, bound when the query string has one of its fields."""
    if any(request.GET.get(name) for name in search_fields):
        return StepSearchForm(run, request.GET)
    return StepSearchForm(run)


def _search_errors(form: StepSearchForm) -> str:
    from django.utils.html import escape

    problems = "; ".join(f"{name}: {' '.join(errs)}" for name, errs in form.errors.items())
    return f'<p class="callout bad" id="search-error">Search refused: {escape(problems)}</p>'


def _listed(marks: list[timeline.Mark], found: StepSearchForm) -> list[int]:
    """The step numbers the list shows: all of them, or the search's matches."""
    if not found.active:
        return [m.number for m in marks]
    matches = found.matches()
    return [m.number for m in marks if m.number in matches]


def _list_context(
    run: Run,
    marks: list[timeline.Mark],
    found: StepSearchForm,
    selected: int | None,
    win: timeline.Window | None = None,
) -> dict[str, Any]:
    """What the step list (or a page of it) renders."""
    if win is None:
        win = timeline.window(_listed(marks, found), selected)
    run_url = reverse("debugger:run-detail", args=[run.pk])
    search_qs = found.query_string()
    return {
        "run": run,
        "list_rows": timeline.rows(run, win.shown) if win.shown else [],
        "window": win,
        "listed": len(win.numbers),
        "search": found,
        "search_qs": search_qs,
        "list_url": f"{run_url}?{search_qs}{'&' if search_qs else ''}",
        "step_url": reverse("debugger:run-step", args=[run.pk, 0]).removesuffix("0/"),
    }


def _list_page_request(request: HttpRequest) -> bool:
    return bool(request.htmx) and any(k in request.GET for k in ("after", "before", "around"))


def _list_page(
    request: HtmxHttpRequest, run: Run, marks: list[timeline.Mark], found: StepSearchForm
) -> HttpResponse:
    """More rows of the step list: after or before a step (scrolling), or a new window
    around one (a step picked outside the rows the list holds)."""
    listed = _listed(marks, found)
    key = next(k for k in ("after", "before", "around") if k in request.GET)
    value = request.GET[key]
    if not (value.isascii() and value.isdigit()) or len(value) > 9:
        return HttpResponse(f"{key} must be a step number", status=400)
    n = int(value)
    if key == "around":
        context = {**_list_context(run, marks, found, n), "selected": n}
        return render(request, "debugger/run_detail.html#steplist", context)
    win = timeline.page_after(listed, n) if key == "after" else timeline.page_before(listed, n)
    context = {**_list_context(run, marks, found, None, win), "part": key}
    return render(request, "debugger/run_detail.html#listpage", context)


def _step_context(run: Run, step: Step) -> dict[str, Any]:
    return {
        "sv": timeline.step_view(run, step),
        "version": timeline.version(run),
        "watch_paths": watch_suggestions(run, step.number),
    }


WATCH_SUGGESTIONS = 8


def watch_suggestions(run: Run, number: int | None = None) -> list[str]:
    """Paths worth watching in this run, deepest first: those step `number` changed (from
    the snapshots' path index, no state read), else those its latest steps changed."""
    snaps = Snapshot.objects.filter(run=run).exclude(paths="").order_by("-seq")
    rows = []
    if number is not None:
        # Its post snapshot's (a pre that refers to the step before carries that one's).
        rows = list(snaps.filter(step=number).values_list("paths", flat=True)[:1])
    if not rows:
        rows = list(snaps.values_list("paths", flat=True)[:6])
    found: dict[str, None] = {}
    for text in rows:
        for path in watch.named_paths(text):
            found.setdefault(watch.format_path(path))
    return sorted(found, key=lambda p: (-p.count(".") - p.count("["), p))[:WATCH_SUGGESTIONS]


# --- actions --------------------------------------------------------------------------------


def _back(request: HttpRequest, run: Run) -> HttpResponse:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, {request.get_host()}, request.is_secure()
    ):
        return redirect(target)
    return redirect("debugger:run-detail", run_id=run.pk)


@role_required
@require_POST
def cancel_run(request: HttpRequest, run_id: Any) -> HttpResponse:
    return _with_reason(
        request,
        run_id,
        services.cancel_run,
        "Run cancelled; its reservations are being released.",
        "Not cancelled",
    )


def _with_reason(
    request: HttpRequest,
    run_id: Any,
    action: Any,
    done: str,
    refused: str,
    form_class: Any = CancelForm,
) -> HttpResponse:
    """An operator's action on a run that takes only a reason for the audit log."""
    run = get_run_for(request, run_id, "operate")
    form = form_class(request.POST)
    if not form.is_valid():
        messages.error(request, f"{refused}: the reason {_form_problem(form)}")
        return _back(request, run)
    try:
        action(run, user=request.user, reason=form.cleaned_data["reason"])
        messages.success(request, done)
    except (services.ActionError, services.PinError) as exc:
        messages.error(request, f"{refused}: {exc}")
    return _back(request, run)


def _form_problem(form: Any) -> str:
    """The first problem of a small operator form, as the end of a sentence."""
    errors = next(iter(form.errors.values()))
    text = str(errors[0]).rstrip(".")
    return f"was refused: {text[0].lower()}{text[1:]}."


@role_required
@require_POST
def retry_step(request: HttpRequest, run_id: Any) -> HttpResponse:
    return _with_reason(
        request,
        run_id,
        services.retry_crashed_step,
        "The step will be tried again.",
        "Not retried",
    )


@role_required
@require_POST
def decide(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = get_run_for(request, run_id, "operate")
    form = ApprovalForm(request.POST)
    if not form.is_valid():
        if "decision" in form.errors:
            messages.error(request, "Choose approve or reject.")
        else:
            field = next(iter(form.errors))
            messages.error(request, f"Not decided: the {field} {_form_problem(form)}")
        return _back(request, run)
    data = form.cleaned_data
    try:
        services.decide_approval(
            run,
            user=request.user,
            decision=data["decision"],
            comment=data["comment"],
            resolution=data["resolution"] or None,
        )
        messages.success(
            request,
            "Approved: the run continues."
            if data["decision"] == "approve"
            else "Rejected: the run will fail at this call.",
        )
    except services.ActionError as exc:
        messages.error(request, f"No decision recorded: {exc}")
    return _back(request, run)


# --- snapshots and diffs ----------------------------------------------------------------------


def _snapshot(run: Run, number: int, at: str) -> Snapshot:
    return get_object_or_404(Snapshot, run=run, step=number, at=at)


def _snapshot_context(run: Run, number: int, at: str) -> dict[str, Any]:
    step = get_object_or_404(Step, run=run, number=number)
    snaps = {s.at: s for s in Snapshot.objects.filter(run=run, step=number).defer("data")}
    neighbours = Step.objects.filter(run=run)
    return {
        "run": run,
        "step": step,
        "at": at,
        "snaps": snaps,
        "prev": neighbours.filter(number__lt=number)
        .order_by("-number")
        .values_list("number", flat=True)
        .first(),
        "next": neighbours.filter(number__gt=number)
        .order_by("number")
        .values_list("number", flat=True)
        .first(),
    }


@role_required
def snapshot(request: HtmxHttpRequest, run_id: Any, number: int, at: str) -> HttpResponse:
    run = get_run_for(request, run_id)
    page = _snapshot_context(run, number, at)
    snap = page["snaps"].get(at)
    if snap is None:
        raise Http404("no such snapshot")
    [state] = load_states([snap])  # a keyframe's data is read here, a delta's from the chain
    try:
        path = parse_path(request.GET.get("path", ""))
        value = resolve(state, path)
    except (PathError, KeyError):
        raise Http404("no such path in this snapshot") from None
    start = request.GET.get("from")
    base = reverse("debugger:snapshot", args=[run.pk, number, at])
    tree = render_tree(
        value,
        TreeOptions(
            link=lambda p, lo: _subtree_url(base, p, lo),
            watch=lambda p: watch_url(run.pk, p, number),
        ),
        path=path,
        start=int(start)
        if start and start.isascii() and start.isdigit() and len(start) < 10
        else None,
        size=snap.size if not path else None,
    )
    context = {
        **page,
        "snap": snap,
        "tree": tree,
        "path": path,
        "crumbs": _crumbs(base, path),
        "view": at,
        **abilities(request),
    }
    template = (
        "debugger/snapshot.html#pane"
        if _fragment(request, "snap-pane")
        else "debugger/snapshot.html"
    )
    return render(request, template, context)


def _subtree_url(base: str, path: Path, start: int | None) -> str:
    query = {"path": format_path(path)}
    if start is not None:
        query["from"] = str(start)
    return f"{base}?{urlencode(query)}"


def _crumbs(base: str, path: Path) -> list[tuple[str, str]]:
    crumbs = [("$", base)]
    for i in range(1, len(path) + 1):
        label = f"[{path[i - 1]}]" if isinstance(path[i - 1], int) else str(path[i - 1])
        crumbs.append((label, _subtree_url(base, path[:i], None)))
    return crumbs


@role_required
def snapshot_json(request: HttpRequest, run_id: Any, number: int, at: str) -> HttpResponse:
    run = get_run_for(request, run_id)
    snap = get_object_or_404(Snapshot, run=run, step=number, at=at)
    [state] = load_states([snap])
    body = json.dumps(state, indent=2, ensure_ascii=False)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-step-{number}-{at}.json"'
    return response


@role_required
def step_diff(request: HtmxHttpRequest, run_id: Any, number: int) -> HttpResponse:
    run = get_run_for(request, run_id)
    page = _snapshot_context(run, number, "diff")
    pre, post = page["snaps"].get("pre"), page["snaps"].get("post")
    if pre is None or post is None:
        raise Http404("no such snapshot")
    context = {
        **page,
        "diff": diff_snapshots(pre, post),
        "a": pre,
        "b": post,
        "a_ref": SnapshotRef(run.pk, number, "pre"),
        "b_ref": SnapshotRef(run.pk, number, "post"),
        "view": "diff",
        **abilities(request),
    }
    template = (
        "debugger/diff.html#pane" if _fragment(request, "snap-pane") else "debugger/diff.html"
    )
    return render(request, template, context)


@role_required
def diff_any(request: HtmxHttpRequest) -> HttpResponse:
    """Any two snapshots, of one run or of two: /diff/?a=<run>:<step>:<pre|post>&b=..."""
    form = DiffForm(
        request.GET if ("a" in request.GET or "b" in request.GET) else None,
        initial={"a": request.GET.get("a", "")},
    )
    context: dict[str, Any] = {"form": form, "view": "compare", **abilities(request)}
    if form.is_bound and form.is_valid():
        refs = form.cleaned_data["a"], form.cleaned_data["b"]
        a, b = (_snapshot(get_run_for(request, ref.run_id), ref.step, ref.at) for ref in refs)
        context.update(diff=diff_snapshots(a, b), a=a, b=b, a_ref=refs[0], b_ref=refs[1])
    status = 400 if form.is_bound and not form.is_valid() else 200
    template = (
        "debugger/diff.html#pane" if _fragment(request, "snap-pane") else "debugger/diff.html"
    )
    return render(request, template, context, status=status)


# --- forks: replay from a snapshot, compare a fork with its parent ------------------------

# Which form field a services.ForkError is about; the rest are about the fork point.
FORK_ERROR_FIELDS = {
    "mode": "mode",
    "reason": "reason",
    "state": "state",
    "confirm_live": "confirm_live",
    "version": "version",
}


@role_required
@require_http_methods(["GET", "POST"])
def fork(request: HttpRequest, run_id: Any, number: int, at: str) -> HttpResponse:
    run = get_run_for(request, run_id, "operate")
    source = Snapshot.objects.filter(run=run, step=number, at=at).defer("data").first()
    if request.method == "GET":
        if source is None:
            raise Http404("no such snapshot")
        return _fork_page(request, run, number, at, source, None, None)
    data = request.POST.copy()
    if source is not None and "state" not in data and data.get("state_unchanged") == "1":
        # The page's script leaves an untouched state out (a big one would exceed the
        # upload limit): the snapshot's own state it is.
        [state] = load_states([source])
        data["state"] = forks.state_text(state)
    form = ForkForm(data)
    edited = None
    if form.is_valid():
        edited = form.cleaned_data["state"]
        if source is not None and state_hash(edited) == source.hash:
            edited = None  # reformatted at most: replay the snapshot as it is
        if "preview" in request.POST:
            _check_state(run, edited, form)
        else:
            created = _start_fork(request, run, number, at, edited, form)
            if created is not None:
                return redirect("debugger:run-detail", run_id=created.pk)
    status = 400 if form.errors else 200
    return _fork_page(request, run, number, at, source, form, edited, status)


def _start_fork(
    request: HttpRequest, run: Run, number: int, at: str, state: Any, form: ForkForm
) -> Run | None:
    data = form.cleaned_data
    try:
        created = services.fork_run(
            run,
            step=number,
            at=at,
            state=state,
            mode=data["mode"],
            reason=data["reason"],
            user=request.user,
            confirm_live=data["confirm_live"],
            version=data.get("version") or None,
        )
    except services.ForkError as exc:
        form.add_error(FORK_ERROR_FIELDS.get(exc.field), str(exc))
        return None
    except InvalidInput as exc:  # the parent's agent is not registered in this deployment
        form.add_error(None, f"Can't fork this run: {exc}")
        return None
    edits = " with an edited state" if state is not None else ""
    messages.success(request, f"Forked from step {number} ({at}){edits} in {data['mode']} mode.")
    return created


def _check_state(run: Run, state: Any, form: ForkForm) -> None:
    """Preview: the schema check fork_run would make, without forking."""
    if state is None:
        return
    try:
        get_agent(run.agent).validate_state(state)
    except (ValueError, InvalidInput) as exc:
        form.add_error("state", f"state: {exc}")


def _fork_page(
    request: HttpRequest,
    run: Run,
    number: int,
    at: str,
    source: Snapshot | None,
    form: ForkForm | None,
    edited: Any,
    status: int = 200,
) -> HttpResponse:
    """The form: a new one prefilled with the snapshot's state, or a posted one."""
    changes: StateDiff | None = None
    check: forks.StateCheck | None = None
    if form is None and source is not None:
        [state] = load_states([source])
        form = ForkForm(initial={"mode": "sandbox", "state": forks.state_text(state)})
    elif source is not None and edited is not None:
        [original] = load_states([source])
        changes = diff_states(original, edited, source.size)
    assert form is not None  # a GET without a snapshot is a 404 before this
    if changes is not None or (form.is_bound and not form.errors and edited is None):
        check = forks.StateCheck(diff=changes or StateDiff([]), checked=False)
    mode = form["mode"].value() or "sandbox"
    context = {
        "run": run,
        "number": number,
        "at": at,
        "source": source,
        "step": Step.objects.filter(run=run, number=number).first(),
        "first_step": number if at == "pre" else number + 1,
        "form": form,
        "modes": [(value, name, text, value == mode) for value, name, text in FORK_MODES],
        "effects": services.side_effects_after(run, number, at) if source else [],
        "changes": changes,
        "unchanged": form.is_bound and not form.errors and edited is None,
        # The script may leave the state out of the next post while it is the snapshot's.
        "pristine": not form.is_bound or ("state" not in form.errors and edited is None),
        "view": "edit",
        "check": check,
        "max_bytes": forks.upload_limit(),
        "live_versions": sorted(versions_alive()),
        "open_paths": _fork_open_paths(run, number, at) if source else [],
        **abilities(request),
    }
    return render(request, "debugger/fork.html", context, status=status)


FORK_OPEN_PATHS = 4


def _fork_open_paths(run: Run, number: int, at: str) -> list[str]:
    """Where the editor opens its tree: what changed last before this snapshot (the step
    before a pre snapshot, the step itself for a post one), below the top-level keys: the
    values an operator most likely came to correct."""
    snaps = Snapshot.objects.filter(run=run).exclude(paths="")
    if at == "pre":
        snaps = snaps.filter(seq__lte=Snapshot.seq_for(number, "pre"))
    else:
        snaps = snaps.filter(seq__lte=Snapshot.seq_for(number, "post"))
    text = snaps.order_by("-seq").values_list("paths", flat=True).first()
    deep = [p for p in watch.named_paths(text) if len(p) > 1]
    return [watch.format_path(p) for p in deep[:FORK_OPEN_PATHS]]


@role_required
def compare_runs(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    run = get_run_for(request, run_id)
    context: dict[str, Any] = {
        "run": run,
        "with_text": request.GET.get("with", "").strip(),
        **abilities(request),
    }
    other = None
    if context["with_text"]:
        try:
            other = resolve_run(context["with_text"])
        except RunIdError as exc:
            context.update(with_error=str(exc), candidates=exc.candidates)
    elif run.parent_id:
        other = run.parent
    if run.purged_at is not None:
        return purged_run(request, run, None)
    if other is not None and other.purged_at is not None:
        context["with_error"] = f"run {other.pk} was purged by retention: no states to compare"
        other = None
    if other is None:
        context.update(fork_tree=forks.tree(run), picker=compare.picker(run))
        status = 400 if "with_error" in context else 200
        return render(request, "debugger/compare.html", context, status=status)
    cmp = compare.align(other, run)
    step = request.GET.get("step", "")
    selected = (
        int(step) if step.isascii() and step.isdigit() and len(step) < 10 else cmp.first_divergence
    )
    query = request.GET.copy()
    query.pop("step", None)
    query["step"] = ""
    context.update(
        cmp=cmp,
        other=other,
        selected=selected,
        step_url=f"{request.path}?{query.urlencode()}",
        fork_point=forks.fork_point(run),
        fork_edited=_fork_edited(run),
        ran_on=versions.compared(other, run),
        **_step_diff(cmp, selected),
    )
    if _fragment(request, "compare-diff"):
        return render(request, "debugger/compare.html#diff", context)
    context["picker"] = compare.picker(run)
    context["watch_paths"] = watch_suggestions(run)
    context.update(_compare_watch(request, other, run))
    status = 400 if context.get("watch_error") else 200
    return render(request, "debugger/compare.html", context, status=status)


def _fork_edited(run: Run) -> bool:
    event = forks.fork_event(run)
    return bool(event and (event.payload or {}).get("edited"))


def _step_diff(cmp: compare.Comparison, number: int | None) -> dict[str, Any]:
    """The two runs' post states at one step, as the diff component shows them."""
    if number is None:
        return {}
    snaps = {
        s.run_id: s
        for s in Snapshot.objects.filter(
            run__in=(cmp.left, cmp.right), step=number, at="post"
        ).defer("data")
    }
    a, b = snaps.get(cmp.left.pk), snaps.get(cmp.right.pk)
    if a is None or b is None:
        return {"missing": [r for r, s in ((cmp.left, a), (cmp.right, b)) if s is None]}
    return {
        "diff": diff_snapshots(a, b),
        "a": a,
        "b": b,
        "a_ref": SnapshotRef(cmp.left.pk, number, "post"),
        "b_ref": SnapshotRef(cmp.right.pk, number, "post"),
    }


# --- audit ---------------------------------------------------------------------------------------


@role_required
def audit(request: HtmxHttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    context = {
        "form": form,
        "actions": Paginator(form.actions(), AUDIT_PER_PAGE).get_page(request.GET.get("apage")),
        "calls": Paginator(form.calls(), AUDIT_PER_PAGE).get_page(request.GET.get("cpage")),
        **abilities(request),
    }
    for target in ("audit-actions", "audit-calls"):
        if _fragment(request, target):
            return render(request, f"debugger/audit.html#{target.removeprefix('audit-')}", context)
    return render(request, "debugger/audit.html", context)


@role_required
def audit_csv(request: HttpRequest) -> StreamingHttpResponse:
    form = AuditFilterForm(request.GET)
    response = StreamingHttpResponse(
        audit_log.csv_lines(form.actions(), form.calls()), content_type="text/csv; charset=utf-8"
    )
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="agentrun-audit-{stamp}.csv"'
    return response


@role_required
def audit_chain_export(request: HttpRequest, form_name: str) -> HttpResponse:
    """The events the filters select, with their hashes, to verify offline."""
    if form_name not in audit_export.FORMATS:
        raise Http404("the audit chain exports as chain.csv or chain.jsonl")
    which = AuditFilterForm(request.GET).chain_filter()
    if which is None:
        return HttpResponse("the filters are not valid: see the audit page", status=400)
    response = StreamingHttpResponse(
        audit_export.lines(which, form_name), content_type=audit_export.FORMATS[form_name]
    )
    name = audit_export.filename(form_name, timezone.now())
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@role_required
def audit_badge(request: HttpRequest) -> HttpResponse:
    return render(request, "debugger/audit.html#badge", {"chain": audit_chain.status()})


# --- the fork page's live check of the edited state -------------------------


@role_required
@require_POST
def fork_check(request: HttpRequest, run_id: Any, number: int, at: str) -> HttpResponse:
    """The edited state checked as a fork would check it, and its diff: a fragment."""
    run = get_run_for(request, run_id, "operate")
    source = Snapshot.objects.filter(run=run, step=number, at=at).defer("data").first()
    if source is None:
        raise Http404("no such snapshot")
    check = forks.check_state(run, source, request.POST.get("state"))
    context = {"check": check, "view": "edit", "run": run, "number": number, "at": at}
    # The check was made: its answer, valid or not, is the fragment (htmx swaps a 200).
    return render(request, "debugger/fork.html#check", context)


# --- the run list's rows, a run's input ------------------------------------------


# The kinds as SQL constants, not parameters: SQLite uses a partial index (event_retries)
# only for a condition it can see is the index's own.
assert all(kind.isidentifier() for kind in RETRY_EVENTS)
_RETRY_KINDS = RawSQL(  # noqa: S611 -- our own constants, checked above
    "kind IN (" + ", ".join(f"'{kind}'" for kind in RETRY_EVENTS) + ")",
    (),
    output_field=BooleanField(),
)


def run_rows(runs: QuerySet[Run]) -> QuerySet[Run]:
    """The run list's rows: without their input (it may be a megabyte), with their labels
    (one query for the page). `with_row_facts` adds the rest for the page's runs only."""
    return runs.defer("input").prefetch_related("labels")


# A run without a goal is summed up from its input, read only when it is no bigger than this.
SUMMARY_INPUT_MAX = 64 * 1024


def with_row_facts(runs: list[Run]) -> list[Run]:
    """Each run's goal (read from its input in the database) or else its agent's summary of
    its input (`goal`), and whether a step of it backed off after an error (`backed_off`)
    or crashed (`crashed`) and was tried again.

    One query for the page's runs: in the page's query, SQLite would work these out for
    every matching run before sorting. Both lookups use small partial indexes
    (event_retries, step_crashed). A second one reads the inputs of the runs without a
    goal, those of a reasonable size only.
    """
    facts = (
        Run.objects.filter(pk__in=[run.pk for run in runs])
        .annotate(
            goal=KeyTextTransform("goal", "input"),
            backed_off=Exists(Event.objects.filter(_RETRY_KINDS, run=OuterRef("pk")).order_by()),
            crashed=Exists(Step.objects.filter(run=OuterRef("pk"), crashes__gt=0).order_by()),
        )
        .order_by()
        .values_list("pk", "goal", "backed_off", "crashed")
    )
    by_pk = {pk: rest for pk, *rest in facts} if runs else {}
    for run in runs:
        run.goal, run.backed_off, run.crashed = by_pk.get(run.pk, ("", False, False))
    goalless = [run for run in runs if not run.goal]
    if goalless:
        inputs = dict(
            Run.objects.filter(pk__in=[run.pk for run in goalless])
            .annotate(input_size=Length(Cast("input", TextField())))
            .filter(input_size__lte=SUMMARY_INPUT_MAX)
            .values_list("pk", "input")
        )
        for run in goalless:
            if run.pk in inputs:
                run.goal = run_summary(run.agent, inputs[run.pk])
    return runs


def run_summary(agent: str, input: Any) -> str:
    """What the run is about, in one line: its agent's `summary` of its (redacted) input;
    the input's goal or first field when the agent is unknown here or its hook fails."""
    from agentrun.agents import SUMMARY_CHARS, input_summary
    from agentrun.security.redact import redact_text
    from debugger.jsontree import json_size

    if isinstance(input, dict) and isinstance(input.get("goal"), str) and input["goal"].strip():
        return " ".join(redact_text(input["goal"]).split())[:SUMMARY_CHARS]
    if isinstance(input, dict) and (json_size(input) or SUMMARY_INPUT_MAX + 1) > SUMMARY_INPUT_MAX:
        # A big input (the run page polls): its top-level scalars are enough to sum it up.
        input = {k: v for k, v in input.items() if not isinstance(v, list | dict)}
    shown = redact(input)
    try:
        text = get_agent(agent).summary(shown)
    except Exception:  # noqa: BLE001 -- an agent's hook may not break the page
        text = input_summary(shown)
    return " ".join(str(text or "").split())[:SUMMARY_CHARS]


@role_required
def run_input(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """The run's input as a tree (redacted): what the run page's panel fetches when a long
    input is opened, or a page of its own."""
    run = get_run_for(request, run_id)
    context = {"run": run, "tree": run_input_tree(run)}
    if _fragment(request, "run-input-tree"):
        return render(request, "debugger/run_input.html#tree", context)
    return render(request, "debugger/run_input.html", context)


@role_required
def run_input_json(request: HttpRequest, run_id: Any) -> HttpResponse:
    """The run's input, redacted, as a JSON download."""
    run = get_run_for(request, run_id)
    body = json.dumps(redact(run.input), indent=2, ensure_ascii=False)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-input.json"'
    return response


# --- pins and purged runs ---------------------------------------------------


@role_required
@require_POST
def pin_run(request: HttpRequest, run_id: Any) -> HttpResponse:
    return _with_reason(
        request,
        run_id,
        services.pin_run,
        "Pinned: retention keeps this run and its fork lineage.",
        "Not pinned",
        PinForm,
    )


@role_required
@require_POST
def unpin_run(request: HttpRequest, run_id: Any) -> HttpResponse:
    return _with_reason(
        request,
        run_id,
        services.unpin_run,
        "Unpinned: retention purges this run when its time comes.",
        "Not unpinned",
    )


def purged_run(request: HttpRequest, run: Run, number: int | None) -> HttpResponse:
    """A purged run: its record, events and side-effecting calls (what retention keeps)."""
    from agentrun.models import Event, ToolCall

    context = {
        "run": run,
        "step_asked": number,
        "summary": run_summary(run.agent, run.input),
        "events": Event.objects.filter(run=run).order_by("created_at", "id"),
        "calls": ToolCall.objects.filter(run=run)
        .select_related("step")
        .order_by("step__number", "index"),
        **abilities(request),
    }
    return render(request, "debugger/run_purged.html", context)


# --- short run ids in addresses: /runs/3f2a9c1e/... → /runs/<the whole id>/... ---------------


@role_required
def run_by_short_id(request: HttpRequest, prefix: str, rest: str = "") -> HttpResponse:
    """An address with a run's short id, as typed from a page or a ticket: to the full one."""
    try:
        run = resolve_run(prefix)
    except RunIdError as exc:
        context = {"problem": str(exc), "candidates": exc.candidates, "rest": rest}
        return render(request, "debugger/short_id.html", context, status=404)
    if prefix == str(run.pk):  # the whole id already: the rest of the address is what's wrong
        raise Http404("no such page of a run")
    query = request.META.get("QUERY_STRING", "")
    target = reverse("debugger:run-detail", args=[run.pk]) + rest
    return redirect(f"{target}?{query}" if query else target)


# --- the history of one value ----------------------------------------------------

WATCH_PER_PAGE = 100
VALUE_PREVIEW = 2000


@role_required
def watch_value(request: HtmxHttpRequest, run_id: Any) -> HttpResponse:
    """Every step that changed one value of the run's state (`?path=`), oldest first;
    `&step=N`: where the value changed last before step N and next after it."""
    run = get_run_for(request, run_id)
    text = request.GET.get("path", "")
    step_text = request.GET.get("step", "")
    step = (
        int(step_text)
        if step_text.isascii() and step_text.isdigit() and len(step_text) < 10
        else None
    )
    context: dict[str, Any] = {
        "run": run,
        "path_text": text[:200],
        "step": step,
        "watch_paths": watch_suggestions(run, step),
        **abilities(request),
    }
    if not text.strip():
        return render(request, "debugger/watch.html", context)
    try:
        path = watch.parse_path(text)
    except watch.PathSyntaxError as exc:
        context["error"] = str(exc)
        return render(request, "debugger/watch.html", context, status=400)
    number = request.GET.get("page", "")
    number = int(number) if number.isascii() and number.isdigit() and 0 < len(number) < 7 else 1
    # Read only as far as this page (and one change more), and past the step asked about.
    limit = max(number * WATCH_PER_PAGE, watch.COUNTED)
    found = watch.history(run, path, limit=limit, past_step=step)
    page = WatchPage(number, len(found.changes), found.more)
    details = watch.step_details(found.changes[i] for i in page.object_list)
    display = found.display

    def anchor(index: int | None) -> str | None:
        if index is None:
            return None
        query = urlencode({"path": display, "page": index // WATCH_PER_PAGE + 1})
        return f"?{query}#change-{index}"

    entries = [
        _watch_entry(
            found,
            i,
            details,
            display,
            anchor(i - 1 if i else None),
            anchor(i + 1 if i + 1 < len(found.changes) else None),
        )
        for i in page.object_list
    ]
    context.update(
        found=found,
        display=display,
        pointer=watch.pointer(path),
        page=page,
        entries=entries,
        start_value=_preview(found.start.value),
        current_value=_preview(found.current),
        around=_watch_around(found, step, anchor) if step is not None else None,
    )
    return render(request, "debugger/watch.html", context)


class WatchPage:
    """One page of a history (the few attributes of Django's Page the template uses),
    for a history that may stop at this page's end (`more`: changes after it)."""

    def __init__(self, number: int, found: int, more: bool) -> None:
        last = max(1, -(-found // WATCH_PER_PAGE))
        self.number = number if more else min(number, last)
        first = (self.number - 1) * WATCH_PER_PAGE
        self.object_list = range(first, min(first + WATCH_PER_PAGE, found))
        self.has_previous = self.number > 1
        self.has_next = more or self.object_list.stop < found
        self.has_other_pages = self.has_previous or self.has_next
        self.previous_page_number = self.number - 1
        self.next_page_number = self.number + 1
        self.start_index = first + 1 if found else 0
        self.end_index = self.object_list.stop


def _preview(value: Any) -> dict[str, Any]:
    if value is watch.MISSING:
        return {"exists": False, "text": "", "cut": False}
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return {
        "exists": True,
        "text": text[:VALUE_PREVIEW],
        "cut": len(text) > VALUE_PREVIEW,
        "kind": "string" if isinstance(value, str) else "json",
    }


def _watch_entry(
    found: watch.History,
    index: int,
    details: dict[tuple[str, int], dict[str, Any]],
    display: str,
    prev: str | None,
    next: str | None,
) -> dict[str, Any]:
    c = found.changes[index]
    query = "?" + urlencode({"path": display})
    after_at = c.at
    return {
        "index": index,
        "change": c,
        "before": _preview(c.before),
        "after": _preview(c.after),
        "detail": details.get((str(c.run_id), c.step), {}),
        "prev": prev,
        "next": next,
        "step_url": reverse("debugger:run-step", args=[c.run_id, c.step]),
        "diff_url": reverse("debugger:step-diff", args=[c.run_id, c.step]),
        # The snapshot that holds the value as this change left it.
        "fork_url": reverse("debugger:run-fork", args=[c.run_id, c.step, c.at]),
        "after_url": reverse("debugger:snapshot", args=[c.run_id, c.step, after_at]) + query
        if c.after_exists
        else None,
    }


def _watch_around(found: watch.History, step: int, anchor: Any) -> dict[str, Any]:
    before, at, after = found.around(step)
    index = {id(c): i for i, c in enumerate(found.changes)}
    return {
        "step": step,
        "before": before,
        "before_url": anchor(index[id(before)]) if before else None,
        "at": at,
        "at_url": anchor(index[id(at)]) if at else None,
        "after": after,
        "after_url": anchor(index[id(after)]) if after else None,
    }


def watch_url(run_id: Any, path: Path | str, step: int | None = None) -> str:
    query = {"path": path if isinstance(path, str) else watch.format_path(path)}
    if step is not None:
        query["step"] = str(step)
    return reverse("debugger:run-watch", args=[run_id]) + "?" + urlencode(query)


def _compare_watch(request: HttpRequest, left: Run, right: Run) -> dict[str, Any]:
    """The watched path (`?path=`) in both runs, side by side: each change, and now."""
    text = request.GET.get("path", "")
    context: dict[str, Any] = {"watch_text": text[:200]}
    if not text.strip():
        return context
    try:
        path = watch.parse_path(text)
    except watch.PathSyntaxError as exc:
        context["watch_error"] = str(exc)
        return context
    sides = (watch.history(left, path), watch.history(right, path))
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for side, found in zip(("left", "right"), sides, strict=True):
        for c in found.changes:
            row = rows.setdefault((c.step, c.seq % 2), {"step": c.step, "at": c.at})
            # A fork's inherited change is its parent's: shown once, in the parent's column,
            # when the parent is the run compared with.
            if c.inherited and str(c.run_id) == str(left.pk) and side == "right":
                row["right_inherited"] = True
                continue
            row[side] = {"change": c, "value": _preview(c.after)}
    left_now, right_now = (found.current for found in sides)
    same = watch.same(left_now, right_now)
    return {
        **context,
        "watch": {
            "display": sides[0].display,
            "rows": [rows[k] for k in sorted(rows)],
            "left_now": _preview(left_now),
            "right_now": _preview(right_now),
            "same_now": same,
            "ever": sides[0].ever_existed or sides[1].ever_existed,
            "left_url": watch_url(left.pk, path),
            "right_url": watch_url(right.pk, path),
        },
    }


# --- a run's archive ------------------------------------------------------------


@role_required
def run_export(request: HttpRequest, run_id: Any) -> StreamingHttpResponse:
    """The run's archive as a download (agentrun.lifecycle.archive); ?ancestors=1 adds its parents."""
    from agentrun.api.operations import archive_response
    from agentrun.lifecycle import archive

    run = get_run_for(request, run_id)
    problem = archive.export_problem(run)
    if problem:
        return HttpResponse(problem, status=409, content_type="text/plain")
    ancestors = request.GET.get("ancestors", "") in ("1", "true", "yes")
    return archive_response(run, ancestors=ancestors, user=request.user)


# --- an llm step's request, as it was sent ------------------------------------------------


@role_required
def model_request(request: HtmxHttpRequest, run_id: Any, number: int) -> HttpResponse:
    """The request the step sent to the model, rebuilt from the run's history, with what it
    added to the previous request and what fell out of the context window."""
    run = get_run_for(request, run_id)
    step = get_object_or_404(Step, run=run, number=number)
    if run.purged_at is not None:
        raise Http404("the run was purged by retention: its snapshots are gone")
    try:
        rebuilt = llm_requests.rebuild(step)
        changed = llm_requests.changes(step)
    except llm_requests.NotAnLLMStep:
        raise Http404("this step sent no request to a model") from None
    except LookupError as exc:
        return render(
            request, "debugger/model_request.html", {"run": run, "step": step, "problem": exc}
        )
    if request.GET.get("raw"):
        return HttpResponse(rebuilt.bytes, content_type="application/json; charset=utf-8")
    added, dropped = set(changed.added), set(changed.dropped)
    sent = [
        {"position": pos, "message": msg, "new": pos in added}
        for pos, msg in zip(rebuilt.positions or [None] * len(rebuilt.body["messages"]),
                            rebuilt.body["messages"], strict=True)
    ]  # fmt: skip
    context = {
        "run": run,
        "step": step,
        "rebuilt": rebuilt,
        "size": len(rebuilt.bytes),
        "sent": sent,
        "dropped": [
            {"position": pos, "message": rebuilt.history[pos]}
            for pos in sorted(dropped)
            if pos < len(rebuilt.history)
        ],
        "changed": changed,
        "others": {k: v for k, v in rebuilt.body.items() if k != "messages"},
    }
    return render(request, "debugger/model_request.html", context)


# --- replay batches --------------------------------------------------------------------------

BATCHES_PER_PAGE = 50
BATCH_RUNS_PER_PAGE = 100


@role_required
def batch_list(request: HttpRequest) -> HttpResponse:
    batch_rows = ReplayBatch.objects.select_related("created_by").order_by("-created_at", "-id")
    page = Paginator(batch_rows, BATCHES_PER_PAGE).get_page(request.GET.get("page"))
    rows = []
    for batch in page:
        counts = batches.counts(batch)
        rows.append(
            {
                "batch": batch,
                "tiles": progress.tiles(counts),
                "verdicts": [v for v in progress.verdict_rows(counts) if v.n],
                "live": progress.is_live(batch, counts),
            }
        )
    context = {"page": page, "rows": rows, **abilities(request)}
    return render(request, "debugger/batch_list.html", context)


@role_required
@require_http_methods(["GET", "POST"])
def batch_new(request: HtmxHttpRequest) -> HttpResponse:
    """A batch of the runs the run list's filter (the query string) selects: its options,
    a preview (nothing written), then the batch."""
    check(request, "operate")
    runs = RunFilterForm(request.GET)
    form = BatchForm(request.POST if request.method == "POST" else None)
    found = None
    if form.is_bound and not runs.is_valid():
        form.add_error(None, "The filter is refused: fix it on the run list.")
    elif form.is_valid():
        start, options = form.start(), form.options()
        if "preview" not in request.POST:
            try:
                batch = batches.create(runs.query(), start, **options, user=request.user)
            except batches.BatchError as exc:
                form.refuse(exc)
            else:
                messages.success(request, f"Batch {batch.name} created: its forks are being made.")
                return redirect("debugger:batch-detail", batch_id=batch.pk)
        try:
            plan = batches.plan(runs.query(), start, options["mode"], options["version"])
            found = progress.preview(plan)
        except batches.BatchError as exc:
            form.refuse(exc)
    context = {**_batch_new_context(runs, form), "found": found, **abilities(request)}
    if _fragment(request, "batch-form"):
        # Refused or not, the answer is the form: htmx swaps in a 200 (not a 400).
        return render(request, "debugger/batch_new.html#form", context)
    status = 400 if form.errors or runs.errors else 200
    return render(request, "debugger/batch_new.html", context, status=status)


def _batch_new_context(runs: RunFilterForm, form: BatchForm) -> dict[str, Any]:
    """The new batch page around its form: the runs chosen, the choices, who is alive."""
    query = runs.query() if runs.is_valid() else {}
    return {
        "runs": runs,
        "form": form,
        "matching": runs.filter(Run.objects.all()).count() if runs.is_valid() else 0,
        "filter_parts": progress.filter_parts(query),
        "run_list_url": progress.run_list_url(query),
        "starts": _choices_checked(BATCH_STARTS, form["start_from"].value() or "before-failure"),
        "modes": _choices_checked(FORK_MODES, form["mode"].value() or "sandbox"),
        "alive": sorted(Counter(w.version for w in alive_workers()).items()),
        "tools": sorted(TOOLS),
        "max_in_flight": settings.AGENTRUN_BATCH_MAX_IN_FLIGHT,
        "max_runs": batches.max_runs(),
    }


def _choices_checked(choices: Any, value: str) -> list[tuple[str, str, str, bool]]:
    return [(v, name, text, v == value) for v, name, text in choices]


@role_required
def batch_detail(request: HtmxHttpRequest, batch_id: Any) -> HttpResponse:
    """A batch's progress, live while it makes forks or one of them runs: counts by state,
    the verdicts (each row: the runs with it), each run against its parent."""
    batch = get_batch_for(request, batch_id)
    counts = batches.counts(batch)
    shown = request.GET.get("verdict", "")
    if shown not in progress.VERDICT_NAMES and shown != "skipped":
        shown = ""
    page = Paginator(progress.items(batch, shown), BATCH_RUNS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    live = progress.is_live(batch, counts)
    token = progress.version_token(batch, counts, list(page))
    if _fragment(request, "batch-live") and request.GET.get("v") == token and live:
        return HttpResponse(status=204)
    query = request.GET.copy()
    query["v"] = token
    context = {
        "batch": batch,
        "counts": counts,
        "tiles": progress.tiles(counts),
        "verdicts": progress.verdict_rows(counts),
        "shown": shown,
        "shown_name": progress.VERDICT_NAMES.get(shown, shown),
        "verdict_names": progress.VERDICT_NAMES,
        "page": page,
        "live": live,
        "poll_url": f"{request.path}?{query.urlencode()}",
        "reasons": progress.skip_reasons(batch),
        "start": progress.describe_start(batch.start_from),
        "filter_parts": progress.filter_parts(batch.selection or {}),
        "run_list_url": progress.run_list_url(batch.selection or {}),
        "promotions": batch.promotions.order_by("created_at"),
        "promotable": batch.mode != "live" and not batch.is_active and counts["runs"]["succeeded"],
        **abilities(request),
    }
    if _fragment(request, "batch-live"):
        response = render(request, "debugger/batch_detail.html#live", context)
        return _stop_polling_unless(live, response)
    return render(request, "debugger/batch_detail.html", context)


@role_required
@require_POST
def batch_cancel(request: HttpRequest, batch_id: Any) -> HttpResponse:
    batch = get_batch_for(request, batch_id, "operate")
    form = CancelForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not cancelled: the reason {_form_problem(form)}")
        return redirect("debugger:batch-detail", batch_id=batch.pk)
    try:
        batches.cancel(batch, user=request.user, reason=form.cleaned_data["reason"])
        messages.success(request, "Batch cancelled: no new forks; those made run to their end.")
    except batches.BatchError as exc:
        messages.error(request, f"Not cancelled: {exc}")
    return redirect("debugger:batch-detail", batch_id=batch.pk)


@role_required
@require_http_methods(["GET", "POST"])
def batch_promote(request: HttpRequest, batch_id: Any) -> HttpResponse:
    """What a promotion replays live (its side effects by tool), and the promotion."""
    batch = get_batch_for(request, batch_id, "operate")
    form = PromoteForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            live = batches.promote(
                batch,
                user=request.user,
                name=data["name"] or None,
                reason=data["reason"],
                confirm_live=data["confirm_live"],
            )
        except batches.BatchError as exc:
            form.refuse(exc)
        else:
            messages.success(request, f"Promoted: batch {live.name} replays them live.")
            return redirect("debugger:batch-detail", batch_id=live.pk)
    try:
        found, refused = progress.preview(batches.promotion_plan(batch)), ""
    except batches.BatchError as exc:
        found, refused = None, str(exc)
    context = {
        "batch": batch,
        "form": form,
        "found": found,
        "refused": refused,
        "default_name": f"{batch.name} (live)",
        **abilities(request),
    }
    status = 400 if form.errors or refused else 200
    return render(request, "debugger/batch_promote.html", context, status=status)
