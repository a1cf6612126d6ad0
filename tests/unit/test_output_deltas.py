"""A step's streamed output is coalesced into fenced journal appends (R-EVENT-1)."""

from __future__ import annotations

import asyncio

import pytest

from qimpl.errors import LostOwnership
from qimpl.workflows.deltas import MAX_DELTA_CHARS, OutputDeltas


class Appender:
    def __init__(self, refuse_after: int | None = None) -> None:
        self.appended: list[tuple[int, str]] = []
        self.refuse_after = refuse_after

    async def output_delta(self, step: int, delta: str) -> None:
        if self.refuse_after is not None and len(self.appended) >= self.refuse_after:
            raise LostOwnership("fenced")
        self.appended.append((step, delta))


@pytest.mark.req("R-EVENT-1")
def test_the_first_piece_goes_at_once_the_rest_coalesced_nothing_lost() -> None:
    owner = Appender()
    deltas = OutputDeltas(owner, 3, interval_s=3600)

    async def stream() -> None:
        for piece in ("a", "b", "", "c"):
            await deltas.emit(piece)
        await deltas.flush()

    asyncio.run(stream())
    assert owner.appended == [(3, "a"), (3, "bc")]


@pytest.mark.req("R-EVENT-1")
def test_a_long_piece_is_split_and_a_flush_of_nothing_writes_nothing() -> None:
    owner = Appender()
    deltas = OutputDeltas(owner, 1, interval_s=0)

    async def stream() -> None:
        await deltas.emit("x" * (MAX_DELTA_CHARS + 5))
        await deltas.flush()

    asyncio.run(stream())
    assert [len(d) for _, d in owner.appended] == [MAX_DELTA_CHARS, 5]


@pytest.mark.req("R-EVENT-1")
@pytest.mark.req("R-EXEC-7")
def test_a_refused_append_stops_the_stream() -> None:
    deltas = OutputDeltas(Appender(refuse_after=1), 1, interval_s=0)

    async def stream() -> None:
        await deltas.emit("a")
        await deltas.emit("b")

    with pytest.raises(LostOwnership):
        asyncio.run(stream())


def test_only_text_is_output() -> None:
    with pytest.raises(TypeError):
        asyncio.run(OutputDeltas(Appender(), 1).emit(b"bytes"))  # type: ignore[arg-type]
