"""The harness reads a time its processes stamped (a crash point's evidence) on the
database's clock before it compares it with the database's ``at`` columns: the takeover
figures of the in-transaction scenarios start there (R-EXEC-11)."""

from __future__ import annotations

import time

import pytest

from qualify.scenarios.base import ScenarioContext


class _SkewedDatabase(ScenarioContext):
    """A context whose database clock runs ``ahead`` seconds ahead of this host's; its
    first read is slow (``slow_s``), as a first round trip after a pause can be."""

    def __init__(self, ahead: float, slow_s: float) -> None:  # no stack: only the clock
        self.ahead, self.slow_s, self.reads = ahead, slow_s, 0

    def db_now(self) -> float:
        self.reads += 1
        now = time.time() + self.ahead
        if self.reads == 1:
            time.sleep(self.slow_s)  # the reading is taken early in a long trip
        return now


@pytest.mark.req("R-EXEC-11")
@pytest.mark.parametrize("ahead", [5.0, -3.0])
def test_a_host_time_is_read_on_the_database_clock(ahead: float) -> None:
    ctx = _SkewedDatabase(ahead, slow_s=0.2)
    assert ctx.on_db_clock(1_000.0) == pytest.approx(1_000.0 + ahead, abs=0.02)
    # the offset comes from the shortest trip, not the slow first one (0.1 s off)
    assert ctx.db_clock_offset() == pytest.approx(ahead, abs=0.02)
    assert ctx.reads == 10
