"""Structured JSON logs, one object per line, with run ids where known."""

from __future__ import annotations

import functools
import json
import logging
import sys

from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

__all__ = ["setup_logging", "temporal_runtime"]


_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and every ``extra`` field
    (``run_id``, ``event``, ...). Exceptions contribute their type only, never a trace."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "t": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            doc["exc_type"] = record.exc_info[0].__name__  # never the traceback text
        return json.dumps(doc, default=str)


@functools.cache
def temporal_runtime() -> Runtime:
    """The process's Temporal runtime, its core (Rust) logs forwarded to Python logging so
    that every line a process prints is JSON."""
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")))))


def setup_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
