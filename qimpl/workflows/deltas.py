"""A step's streamed output, coalesced into the run's event journal (R-EVENT-1).

A provider that streams hands each piece to ``StepContext.emit``; ``OutputDeltas``
buffers them and appends at most one ``output`` delta event per ``interval_s`` (the
first piece at once, so the first token is visible without delay), plus whatever is
left when the call returns. Each append is an owner write fenced by the owner's token
(``RunOwner.output_delta``): a refused one raises LostOwnership out of the provider call,
and the owner stops.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["MAX_DELTA_CHARS", "OutputDeltas"]

#: The largest piece one append carries (the database refuses more); longer text is split.
MAX_DELTA_CHARS = 65536


class _Appender(Protocol):
    async def output_delta(self, step: int, delta: str) -> None: ...


class OutputDeltas:
    """The output of step ``step`` of one owner; ``interval_s`` (seconds) bounds how often
    it writes while the provider streams."""

    def __init__(self, owner: _Appender, step: int, *, interval_s: float = 0.1) -> None:
        self.owner = owner
        self.step = step
        self.interval_s = interval_s
        self._buffer: list[str] = []
        self._last = float("-inf")
        #: Appends made (each one ``output`` event).
        self.appended = 0

    async def emit(self, text: str) -> None:
        """Take one piece (TypeError unless it is a string; empty pieces are ignored)."""
        if not isinstance(text, str):
            raise TypeError("an output delta is a string")
        if text:
            self._buffer.append(text)
        if time.monotonic() - self._last >= self.interval_s:
            await self.flush()

    async def flush(self) -> None:
        """Append what is buffered, in pieces of at most MAX_DELTA_CHARS characters."""
        text = "".join(self._buffer)
        self._buffer.clear()
        self._last = time.monotonic()
        for i in range(0, len(text), MAX_DELTA_CHARS):
            await self.owner.output_delta(self.step, text[i:i + MAX_DELTA_CHARS])
            self.appended += 1
