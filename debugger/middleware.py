from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from debugger.access import CONTENT_SECURITY_POLICY


class ContentSecurityPolicyMiddleware:
    """The debugger's CSP for pages outside it (login); the admin keeps its own scripts."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith("/admin/"):
            response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response
