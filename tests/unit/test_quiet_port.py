"""``quiet_port``: the sink's port, below the kernel's ephemeral range so that no
``bind(0)`` of another process (a Temporal server booting) takes it before the sink binds."""

from __future__ import annotations

import random
import socket

import pytest

from qualify import procs
from qualify.errors import HarnessError


def test_quiet_port_is_below_the_ephemeral_range_and_free() -> None:
    low, _ = procs._ephemeral_range()
    for _ in range(20):
        port = procs.quiet_port()
        assert 1024 <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_quiet_port_skips_a_taken_port_and_gives_up_when_all_are(monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = procs._ephemeral_range()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", low - 1))
        monkeypatch.setattr(procs, "_ephemeral_range", lambda: (low, low + 1))

        class Picks(random.Random):
            def __init__(self) -> None:
                super().__init__(0)
                self.calls = 0

            def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:  # type: ignore[override]
                self.calls += 1
                return low - 1 if self.calls == 1 else low - 2

        assert procs.quiet_port(Picks()) == low - 2

        class Always(random.Random):
            def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:  # type: ignore[override]
                return low - 1

        with pytest.raises(HarnessError):
            procs.quiet_port(Always())
