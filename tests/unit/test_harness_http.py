"""The harness's HTTP calls share one TLS context (``qualify.http``): httpx builds and
loads a new ``ssl.SSLContext`` for every top-level call or client it is not given one,
18 ms of CPU each; ``api-contract-matrix`` alone spent about 8 s of a run's CPU on it."""

from __future__ import annotations

import re
from pathlib import Path

import qualify

#: httpx's top-level calls and client constructors, called directly.
DIRECT = re.compile(r"\bhttpx\.(request|get|post|put|patch|delete|options|head|stream|Client|AsyncClient)\(")


def test_the_harness_makes_no_http_call_without_the_shared_context() -> None:
    root = Path(qualify.__file__).parent
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py")) if path.name != "http.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if DIRECT.search(line)]
    assert not found, f"use qualify.http (the shared TLS context): {found}"
