"""CORS for browser clients (R-EVENT-6): Starlette's middleware, its refusals coded.

A preflight Starlette refuses (an origin off ``QIMPL_CORS_ORIGINS``, a method or header
the API does not take cross-origin) was a ``text/plain`` 400 "Disallowed CORS origin",
the one error of the API without a ``code``. It is now 400 ``cors_preflight_refused``
with Starlette's own reason in the message, and the same headers.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

__all__ = ["CodedCORSMiddleware"]


class CodedCORSMiddleware(CORSMiddleware):
    """``CORSMiddleware`` whose refused preflight is a coded JSON error."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers=request_headers)
        if response.status_code != 400:
            return response
        reason = bytes(response.body).decode("utf-8", "replace")
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        return JSONResponse({"code": "cors_preflight_refused", "message": reason}, status_code=400,
                            headers=headers)
