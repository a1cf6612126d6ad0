"""Shared fixtures. ``req`` ties a test to spec IDs; ``integration`` needs the embedded stack."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest


def assert_eventually(check: Callable[[], bool], *, timeout: timedelta, what: str = "condition") -> None:
    """Poll ``check`` until true or fail after ``timeout`` (never a bare sleep in tests)."""
    deadline = time.monotonic() + timeout.total_seconds()
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout.total_seconds()} s")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def stack() -> Iterator[object]:
    """One embedded stack per xdist worker (tests create their own databases in it)."""
    from qualify.stack import EmbeddedStack

    s = EmbeddedStack()
    s.start()
    try:
        yield s
    finally:
        s.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
