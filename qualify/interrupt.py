"""Ctrl-C and SIGTERM that cannot be lost, and cleanup that cannot be cut short.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread is;
raised inside certain hooks (logging's fork handlers around ``subprocess`` with
``preexec_fn``, ``__del__`` methods) it is printed and swallowed. So the handler also
sets a flag, and the harness calls ``check()`` at every safe point (stack boot steps,
between scenarios, in every wait loop): a swallowed interrupt is raised again there.
``deferred()`` makes teardown immune to a second Ctrl-C: it is recorded, not raised.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["check", "consume", "deferred", "install", "requested"]

_requested = threading.Event()
_deferring = 0


def _handler(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    if _deferring == 0:
        raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT and SIGTERM through the flag (main thread only)."""
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if an interrupt arrived and was lost (not while deferred)."""
    if _requested.is_set() and _deferring == 0:
        raise KeyboardInterrupt


def consume() -> None:
    """Forget an interrupt that was expected and handled (``--keep``'s Ctrl-C)."""
    _requested.clear()


@contextmanager
def deferred() -> Iterator[None]:
    """Run cleanup to the end even if Ctrl-C arrives again."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
