"""The host's true wall clock for the harness's own records inside a worker (R-Q-10).

A worker in a ``skew-worker-clock`` schedule runs with libfaketime preloaded, which moves
what ``time.time()`` (libc's ``clock_gettime``) answers in that process. The fakes that
record evidence from inside it (the synthetic provider's ``provider_calls.jsonl``, its
barriers and cancellations) must still stamp it on the clock the rest of the history uses
(the harness's and the database's, both the host's), or the checkers would compare a
skewed harness record with the database — a harness error, not a product one. So they read
``CLOCK_REALTIME`` through the raw system call, which libfaketime does not intercept (it
wraps the libc functions, not ``syscall``), falling back to ``time.time()`` where the call
number is unknown (then a skewed worker's records are skewed: the nemesis evidence shows it).
"""

from __future__ import annotations

import ctypes
import platform
import time

__all__ = ["true_time"]

#: ``SYS_clock_gettime`` by machine (Linux).
_NR = {"x86_64": 228, "aarch64": 113}.get(platform.machine())
_CLOCK_REALTIME = 0


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True) if _NR is not None else None
except OSError:
    _libc = None


def true_time() -> float:
    """Seconds since the epoch on the kernel's ``CLOCK_REALTIME``, bypassing libc (so
    bypassing an ``LD_PRELOAD``ed libfaketime)."""
    if _libc is not None and _NR is not None:
        ts = _Timespec()
        if _libc.syscall(_NR, _CLOCK_REALTIME, ctypes.byref(ts)) == 0:
            return ts.tv_sec + ts.tv_nsec / 1e9
    return time.time()
