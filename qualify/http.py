"""The harness's HTTP calls: httpx's top-level functions and clients with one TLS context,
built once per process.

Unless it is given one, httpx builds a new ``ssl.SSLContext`` (and loads the CA bundle)
for every ``httpx.get`` and every ``httpx.Client()``: 18 ms of CPU each on the project's
2-core machine (0.06 ms with a shared context), and a scenario polls a run every 50 ms.
Every URL the harness calls is plain http on 127.0.0.1, so the context is never used for
TLS. Nothing else changes: each top-level call still opens its own connection.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

__all__ = ["TLS", "async_client", "client", "delete", "get", "options", "post", "request", "stream"]

#: The one TLS context of this process's harness calls.
TLS = ssl.create_default_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.request`` with the shared context; raises what httpx raises."""
    return httpx.request(method, url, verify=TLS, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.get`` with the shared context; raises what httpx raises."""
    return httpx.get(url, verify=TLS, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.post`` with the shared context; raises what httpx raises."""
    return httpx.post(url, verify=TLS, **kwargs)


def options(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.options`` with the shared context; raises what httpx raises."""
    return httpx.options(url, verify=TLS, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.delete`` with the shared context; raises what httpx raises."""
    return httpx.delete(url, verify=TLS, **kwargs)


@contextmanager
def stream(method: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
    """``httpx.stream`` with the shared context (a context manager, as httpx's)."""
    with httpx.stream(method, url, verify=TLS, **kwargs) as resp:
        yield resp


def client(**kwargs: Any) -> httpx.Client:
    """``httpx.Client`` with the shared context."""
    return httpx.Client(verify=TLS, **kwargs)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    """``httpx.AsyncClient`` with the shared context."""
    return httpx.AsyncClient(verify=TLS, **kwargs)
