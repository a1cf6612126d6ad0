"""One error shape everywhere: ``{"code", "message", ...}`` with a machine-readable code."""

from __future__ import annotations

import traceback
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from qimpl.api.validation import listed

__all__ = ["UNAUTHENTICATED_HEADERS", "ApiError", "database_unavailable", "install_error_handlers", "origin"]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def origin(exc: BaseException) -> dict[str, str]:
    """Where ``exc`` came from, for the log and never the client: ``cause``, the type of
    the first exception of its chain (``__cause__``, else ``__context__`` unless
    suppressed) when that is another one, and ``origin``, the innermost frame of qimpl's
    own code (``module:line``) in the deepest exception of the chain that has one. No
    message, no trace, no values; ``{}`` if any of it cannot be read."""
    try:
        chain: list[BaseException] = []
        seen: BaseException | None = exc
        while seen is not None and len(chain) < 8 and all(seen is not e for e in chain):
            chain.append(seen)
            seen = seen.__cause__ if seen.__cause__ is not None else (
                None if seen.__suppress_context__ else seen.__context__)
        out: dict[str, str] = {"cause": type(chain[-1]).__name__} if len(chain) > 1 else {}
        for err in reversed(chain):
            own = [f"{name}:{line}" for frame, line in traceback.walk_tb(err.__traceback__)
                   if str(name := frame.f_globals.get("__name__", "")).startswith("qimpl.")]
            if own:
                out["origin"] = own[-1]
                break
        return out
    except Exception:  # noqa: BLE001 - it runs inside the 500 handler: never fail it
        return {}


#: What a 401 ``unauthenticated`` carries beside its body: the scheme to authenticate with.
UNAUTHENTICATED_HEADERS = {"WWW-Authenticate": 'Bearer realm="qimpl"'}


def _body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}


def database_unavailable(exc: BaseException) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The answer to a request the database could not serve (``exc``: a lost connection,
    the pool's timeout), logged once as ``api.database_unavailable`` with its type: ``(503,
    {"code": "database_unavailable", "message", "retryable": true}, {"Retry-After": "1"})``.
    Coded, retryable, and logged, whichever layer answers (issue 22, items 7 and 11)."""
    import logging

    logging.getLogger("qimpl.api").warning(
        "database unavailable: %s", type(exc).__name__,
        extra={"event": "api.database_unavailable", "exc_type": type(exc).__name__})
    return 503, _body("database_unavailable", "the database is unavailable; retry shortly",
                      retryable=True), {"Retry-After": "1"}


def _methods_of(request: Request) -> list[str]:
    """The methods the request's path is served with: its operations in the app's OpenAPI
    document (every route of the API is in it), matched segment by segment."""
    asked = request.url.path.split("/")

    def fits(template: str) -> bool:
        parts = template.split("/")
        return len(parts) == len(asked) and all(
            p == a or (p.startswith("{") and p.endswith("}") and a) for p, a in zip(parts, asked, strict=True))

    paths = request.app.openapi().get("paths", {})
    methods = {m.upper() for t, ops in paths.items() if fits(t) for m in ops}
    return sorted(methods | ({"HEAD"} if "GET" in methods else set()))  # qimpl.api.head


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        extra = dict(exc.extra)
        retry_after = extra.pop("retry_after", None)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if exc.code == "unauthenticated":
            headers.update(UNAUTHENTICATED_HEADERS)  # RFC 9110: a 401 names its scheme
        return JSONResponse(_body(exc.code, exc.message, **extra), status_code=exc.status,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors, omitted = listed(exc.errors())
        first = errors[0]["code"] if errors else "invalid_request"
        extra: dict[str, Any] = {"errors": errors}
        if omitted:
            extra["errors_omitted"] = omitted
        return JSONResponse(
            _body(first, "the request does not match the schema", **extra), status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # A body that cannot even be parsed (not JSON, a broken encoding) is answered
            # like invalid JSON: 422 ``malformed_body``, a code every route documents.
            # Same shape as a validation error's: ``errors`` lists the one problem. FastAPI
            # raises this 400 from the parser's own error: a body nested past the decoder's
            # recursion limit is said as such, not as "not JSON".
            why = ("the body's JSON is nested too deeply to parse" if isinstance(exc.__cause__, RecursionError)
                   else "the body is not JSON in UTF-8")
            return JSONResponse(_body("malformed_body", "the request body could not be parsed",
                                      errors=[{"loc": ["body"], "code": "malformed_body", "msg": why}]),
                                status_code=422)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            # Every method of the path: Starlette names only the first route's.
            headers["Allow"] = ", ".join(_methods_of(request))
        return JSONResponse(_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers)

    @app.exception_handler(psycopg.DataError)
    @app.exception_handler(UnicodeEncodeError)
    async def _unstorable(_: Request, exc: Exception) -> JSONResponse:
        # A value PostgreSQL cannot store (a NUL character, a lone surrogate in a JSON
        # result): the request's transaction rolled back, nothing was written.
        return JSONResponse(_body("value_unstorable", "the request holds a value that cannot be "
                                  "stored (a NUL character or an unpaired surrogate)"), status_code=422)

    @app.exception_handler(psycopg.errors.LockNotAvailable)
    async def _busy(_: Request, exc: Exception) -> JSONResponse:
        # lock_timeout: the run's row stayed locked (an owner paused inside a transaction
        # loses it within the lease bound). Nothing was written: the request may be retried.
        return JSONResponse(_body("run_busy", "a row or table this request needs is locked; retry shortly",
                                  retryable=True),
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(psycopg.OperationalError)
    async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        # The database connection was lost mid-request (a killed backend, a restart) or no
        # pooled connection came within QIMPL_API_POOL_TIMEOUT_S (PoolTimeout): the
        # request's transaction did not commit.
        status, body, headers = database_unavailable(exc)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Never leak a stack trace: the type name goes to the log, a code to the client.
        import logging

        logging.getLogger("qimpl.api").error(
            "unhandled %s", type(exc).__name__,
            extra={"event": "api.unhandled", "exc_type": type(exc).__name__, **origin(exc)})
        return JSONResponse(_body("internal_error", "internal error"), status_code=500)
