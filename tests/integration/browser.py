"""Headless Chromium for the tests that need a real browser (Debian's ``chromium``, driven
by ``playwright`` without a browser download). Skipped when either is missing, unless
``QIMPL_REQUIRE_BROWSER=1`` (``.ci/run``): then a missing browser fails the test."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "browser_or_skip"]

CHROMIUM = Path("/usr/bin/chromium")
#: The flags this machine's Chromium needs headless (no sandbox as root, no network chatter).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def browser_or_skip() -> Any:
    """``playwright.sync_api.sync_playwright``, or skip (fail under ``QIMPL_REQUIRE_BROWSER``)."""
    required = os.environ.get("QIMPL_REQUIRE_BROWSER") == "1"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if required:
            raise
        pytest.skip("playwright is not installed (the dev extra)")
    if not CHROMIUM.exists():
        if required:
            pytest.fail(f"{CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip("Debian's chromium is not installed")
    return sync_playwright
