from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from agentrun.models import Run


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    runs = Run.objects.all()[:100]
    return render(request, "debugger/run_list.html", {"runs": runs})


@login_required
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    return render(request, "debugger/run_detail.html", {"run": run, "steps": run.steps.all()})
