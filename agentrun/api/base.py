"""Django Ninja with agentrun's API conventions (the operations are in agentrun.api.operations).

- Every error is JSON `{"detail": "..."}`, `application/json`, with extra members
  where they help (`field`: the request member at fault): raise ApiError. A 401
  says how to authenticate (WWW-Authenticate), a 405 which methods to use (Allow),
  a 413 the size limit; a database that is down or restarting a 503 with Retry-After
  (agentrun.infra.outage); anything unexpected is logged and a JSON 500.
- A request that doesn't match the declared schema is a 400 whose detail is written
  from that schema ("limit must be between 1 and 500, not 0"), not Ninja's 422 list;
  a path parameter that can't name anything (a run id that is no UUID) is a 404.
- Bodies are parsed strictly (a `parse` function) and query strings checked for text
  the database can't store, before the models see them.
- The OpenAPI document keeps its names: operation ids in camelCase, the security
  schemes `bearerAuth` and `sessionAuth`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import URLPattern, path
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationErrorContext
from ninja.openapi.schema import OpenAPISchema
from ninja.operation import Operation
from ninja.parser import Parser
from pydantic import BaseModel, ValidationError

from agentrun.infra.outage import unavailable
from agentrun.security.storable import check_storable

log = logging.getLogger(__name__)

#: What an error status means in this API (the document's response descriptions).
ERROR_MEANINGS = {
    400: "Invalid input; `detail` names the problem (and `field` the input, where one is to "
    "blame). Nothing was stored.",
    401: "No credentials, or an invalid token.",
    403: "No role, not an operator, or a failed CSRF check (session POSTs).",
    404: "No such run or snapshot (an invalid UUID is not found either).",
    409: "The action doesn't apply to the run as it is.",
    413: "The request body is larger than the server accepts.",
    503: "The database is down or restarting; nothing was stored. Try again after the "
    "seconds `Retry-After` gives.",
}


class ApiError(Exception):
    """An error answer: `detail`, plus `extra` members of the JSON body (e.g. `field`)."""

    def __init__(self, status: int, detail: str, **extra: Any):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra


class _Parser(Parser):
    def __init__(self, parse: Callable[[bytes], Any]):
        self.parse = parse

    def parse_body(self, request: HttpRequest) -> Any:
        try:
            return self.parse(request.body)
        except ValueError as exc:
            raise ApiError(400, f"request body: {exc}") from None

    def parse_querydict(self, data: Any, list_fields: list[str], request: HttpRequest) -> Any:
        values = super().parse_querydict(data, list_fields, request)
        for name, value in values.items():
            try:
                check_storable(value, name)
            except ValueError as exc:
                raise ApiError(400, str(exc), field=name) from None
        return values


class Api(NinjaAPI):
    def __init__(self, *, prefix: str, parse: Callable[[bytes], Any], **kwargs: Any):
        super().__init__(
            openapi_url=None,  # served by an operation of its own, documented like the rest
            docs_url=None,  # no pages from a CDN
            servers=[{"url": "/"}],
            parser=_Parser(parse),
            **kwargs,
        )
        self.prefix = prefix

    def get_content_type(self) -> str:
        return "application/json"

    def error(self, request: HttpRequest, status: int, detail: str, **extra: Any) -> HttpResponse:
        response = self.create_response(request, {"detail": detail, **extra}, status=status)
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="agentrun"'
        return response

    def set_default_exception_handlers(self) -> None:
        for exc_class, handler in (
            (ApiError, self._api_error),
            (AuthenticationError, self._anonymous),
            (HttpError, self._http_error),
            (RequestDataTooBig, self._too_big),
            (SuspiciousOperation, self._suspicious),
            (OperationalError, self._unavailable),
            (InterfaceError, self._unavailable),
            (Exception, self._internal),
        ):
            self.add_exception_handler(exc_class, handler)  # type: ignore[arg-type]

    def _api_error(self, request: HttpRequest, exc: ApiError) -> HttpResponse:
        return self.error(request, exc.status, exc.detail, **exc.extra)

    def _anonymous(self, request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return self.error(
            request, 401, "authentication required: log in, or send `Authorization: Bearer <token>`"
        )

    def _http_error(self, request: HttpRequest, exc: HttpError) -> HttpResponse:
        if isinstance(exc.__cause__, ApiError):  # Ninja wraps what the body parser raises
            return self._api_error(request, exc.__cause__)
        return self.error(request, exc.status_code, str(exc))

    def _too_big(self, request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return self.error(request, 413, f"request body too large: the limit is {limit} bytes")

    def _suspicious(self, request: HttpRequest, exc: SuspiciousOperation) -> HttpResponse:
        return self.error(request, 400, f"bad request: {exc}")

    def _unavailable(self, request: HttpRequest, exc: DatabaseError) -> HttpResponse:
        return unavailable(request, exc)

    def _internal(self, request: HttpRequest, exc: Exception) -> HttpResponse:
        log.exception("API error on %s %s", request.method, request.path, exc_info=exc)
        return self.error(request, 500, "internal error; it has been logged")

    def validation_error_from_error_contexts(  # type: ignore[override]
        self, error_contexts: list[ValidationErrorContext]
    ) -> ApiError:
        return refusal(error_contexts)

    def get_openapi_operation_id(self, operation: Operation) -> str:
        first, *rest = operation.view_func.__name__.split("_")
        return first + "".join(word.title() for word in rest)

    def get_openapi_schema(self, **kwargs: Any) -> OpenAPISchema:
        return _Document(self, self.prefix.strip("/") + "/")

    @functools.cache  # noqa: B019 - one API object, alive as long as the process
    def document(self) -> dict[str, Any]:
        return dict(self.get_openapi_schema())

    def url_patterns(self) -> list[URLPattern]:
        """One pattern per path (Ninja's API root excluded); a method the path doesn't
        have is a JSON 405."""
        patterns: dict[str, URLPattern] = {}
        for pattern in self.urls[0]:
            route = str(pattern.pattern)
            if route and route not in patterns and isinstance(pattern, URLPattern):
                patterns[route] = path(route, self._json_405(pattern.callback), name=pattern.name)
        # A fixed route (runs/import) before a parameter one that would match it (runs/<id>).
        return sorted(patterns.values(), key=lambda p: "<" in str(p.pattern))

    def _json_405(self, view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        def view_or_405(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            response = view(request, *args, **kwargs)
            if not isinstance(response, HttpResponseNotAllowed):
                return response
            allowed = sorted(m.strip() for m in response["Allow"].split(","))
            response = self.error(
                request, 405, f"method {request.method} not allowed; use {' or '.join(allowed)}"
            )
            response["Allow"] = ", ".join(allowed)
            return response

        view_or_405.csrf_exempt = True  # type: ignore[attr-defined]  # see SessionCookie
        return view_or_405


class _Document(OpenAPISchema):
    def _extract_parameters(self, model: Any) -> list[dict[str, Any]]:
        params = super()._extract_parameters(model)
        for param in params:  # an optional parameter is absent, never null
            options = param["schema"].pop("anyOf", None)
            if options:
                param["schema"].update(*(o for o in options if o != {"type": "null"}))
        return params

    def operation_security(self, operation: Operation) -> list[dict[str, Any]] | None:
        result: list[dict[str, Any]] = []
        for auth in operation.auth_callbacks:
            name = auth.scheme_name  # type: ignore[attr-defined]
            self.securitySchemes[name] = auth.openapi_security_schema  # type: ignore[attr-defined]
            result.append({name: []})
        return result or None

    def responses(self, operation: Operation) -> dict[int, Any]:
        result = super().responses(operation)
        # Any operation may meet a database that is down (agentrun.infra.outage).
        result.setdefault(
            503,
            {
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                "headers": {
                    "Retry-After": {
                        "description": "Seconds to wait before trying again.",
                        "schema": {"type": "integer"},
                    }
                },
            },
        )
        for status, response in result.items():
            response["description"] = ERROR_MEANINGS.get(status, HTTPStatus(status).phrase)
        return result


# --- a 400 (or 404) from a validation error, in the schema's own terms --------------------


def refusal(contexts: list[ValidationErrorContext]) -> ApiError:
    """The first thing wrong with a request, for its sender."""
    by_source = {c.model.__ninja_param_source__: c for c in contexts}
    if "path" in by_source:  # nothing there: the rest of the request doesn't matter
        return _path_refusal(by_source["path"])
    if "body" in by_source:
        return _body_refusal(by_source["body"])
    return _query_refusal(by_source["query"])


def _path_refusal(context: ValidationErrorContext) -> ApiError:
    error = context.pydantic_validation_error.errors()[0]
    name = str(error["loc"][0])
    schema = _properties(context.model)[name]
    if schema.get("format") == "uuid":
        return ApiError(404, f"no run {error['input']!r}: not a valid run id (a UUID)")
    return ApiError(404, f"not found: {_problem(name, schema, error, quote=True)}")


def _query_refusal(context: ValidationErrorContext) -> ApiError:
    error = context.pydantic_validation_error.errors()[0]
    name = str(error["loc"][0])
    schema = _properties(context.model)[name]
    required = context.model.model_fields[name].is_required()
    if error["type"] == "missing" or (required and error["input"] == ""):
        return ApiError(400, f"the {name} parameter is required{_hint(schema)}", field=name)
    return ApiError(400, _problem(name, schema, error, quote=True), field=name)


def _body_refusal(context: ValidationErrorContext) -> ApiError:
    model = context.model
    param = model.__read_from_single_attr__
    payload = _payload_model(model.model_fields[param].annotation)
    errors: list[Any] = [
        {**e, "loc": e["loc"][1:]} for e in context.pydantic_validation_error.errors()
    ]
    if errors[0]["loc"] == () and errors[0]["type"] == "missing":
        errors = _errors_of(payload, {})  # no body at all: as if it were {}
    if not errors or errors[0]["loc"] == ():  # the body as a whole
        return ApiError(400, "request body must be a JSON object")
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        expected = ", ".join(payload.model_fields)
        return ApiError(400, f"unknown field(s): {', '.join(unknown)} (expected: {expected})")
    error = errors[0]
    name = str(error["loc"][0])
    schema = _properties(payload)[name]
    if error["type"] == "missing":
        return ApiError(400, f"{name} is required{_hint(schema)}", field=name)
    return ApiError(400, _problem(name, schema, error, quote=False), field=name)


def _errors_of(model: type[BaseModel], value: Any) -> list[Any]:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        return list(exc.errors())
    return []


def _payload_model(annotation: Any) -> type[BaseModel]:
    """The body's model, from `Model` or `Model | None`."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    raise TypeError(f"no model in {annotation!r}")


@functools.cache
def _properties(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()["properties"]


_RANGE_ERRORS = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}
_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a JSON object",
    "array": "a list",
    "null": "null",
}


def _problem(name: str, schema: dict[str, Any], error: Any, *, quote: bool) -> str:
    """What is wrong with one value, in the terms of its JSON schema."""
    kind, value = error["type"], error["input"]
    if kind == "literal_error" and isinstance(value, str):
        return f"unknown {name} {value!r}: {name} must be {_choices(schema)}"
    if kind in _RANGE_ERRORS:
        span = _span(schema.get("minimum"), schema.get("maximum"))
        return f"{name} must be {span}, not {value}"
    if kind in ("string_too_short", "string_too_long"):
        span = _span(schema.get("minLength"), schema.get("maxLength"), between="{} to {}")
        return f"{name} must be {span} characters long"
    problem = f"{name} must be {_type_name(schema)}"
    if quote:  # a short string from the URL: worth repeating
        problem += f", not {_shorten(value)!r}"
    return problem


def _span(low: Any, high: Any, between: str = "between {} and {}") -> str:
    if low is None:
        return f"at most {high}"
    return f"at least {low}" if high is None else between.format(low, high)


def _hint(schema: dict[str, Any]) -> str:
    """A hint from the member's description (its first sentence), for a message:
    ": the step whose snapshot to fork from"."""
    description = schema.get("description", "").split(". ")[0].rstrip(".")
    return f": {description[:1].lower()}{description[1:]}" if description else ""


def _type_name(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(_type_name(option) for option in schema["anyOf"])
    if schema.get("format") == "uuid":
        return "a run id (a UUID)"
    return _TYPE_NAMES.get(schema.get("type", ""), "valid")


def _choices(schema: dict[str, Any]) -> str:
    values = next(o["enum"] for o in [schema, *schema.get("anyOf", ())] if "enum" in o)
    if len(values) == 2:
        return " or ".join(f'"{v}"' for v in values)
    return "one of " + ", ".join(values)


def _shorten(value: Any, limit: int = 60) -> Any:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"
