"""Saved views: an operator's named filters of the run list, saved and deleted from it."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.db import transaction
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from agentrun.lifecycle import selection
from agentrun.models import SavedView
from debugger.access import check, role_required
from debugger.forms import RunFilterForm


class SaveViewForm(forms.Form):
    name = forms.CharField(max_length=100, strip=True)
    # The run list's query string, as the page had it.
    query = forms.CharField(required=False, max_length=4000)


def view_url(query: dict) -> str:
    """The run list with this filter: the saved view's shareable link (its parameters in
    the selection's order, whatever order the database hands the JSON back in)."""
    ordered = [(name, query[name]) for name in selection.FIELDS if name in query]
    text = urlencode(ordered, doseq=True)
    return reverse("debugger:run-list") + (f"?{text}" if text else "")


@role_required
@require_POST
def save_view(request: HttpRequest) -> HttpResponse:
    check(request, "operate")
    form = SaveViewForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Not saved: a view needs a name of at most 100 characters.")
        return redirect(reverse("debugger:run-list") + "?" + request.POST.get("query", "")[:4000])
    chosen = RunFilterForm(QueryDict(form.cleaned_data["query"]))
    if not chosen.is_valid():
        messages.error(request, "Not saved: the filter has a problem; fix it first.")
        return redirect(reverse("debugger:run-list") + "?" + form.cleaned_data["query"])
    name, query = form.cleaned_data["name"], chosen.query()
    with transaction.atomic():
        mine = SavedView.objects.select_for_update().filter(owner=request.user)
        existing = mine.filter(name=name).first()
        if existing is None and mine.count() >= SavedView.MAX_PER_OWNER:
            messages.error(request, f"Not saved: you keep {SavedView.MAX_PER_OWNER} views at most.")
            return redirect(view_url(query))
        SavedView.objects.update_or_create(owner=request.user, name=name, defaults={"query": query})
    messages.success(request, f"Saved the view “{name}”.")
    return redirect(view_url(query))


@role_required
@require_POST
def delete_view(request: HttpRequest, view_id: int) -> HttpResponse:
    check(request, "operate")
    view = get_object_or_404(SavedView, pk=view_id, owner=request.user)
    view.delete()
    messages.success(request, f"Deleted the view “{view.name}”.")
    return redirect(reverse("debugger:run-list"))
