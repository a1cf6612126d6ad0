"""Structured JSON logs, one object per line, with run ids where known."""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
import sys
from datetime import timedelta
from urllib.parse import unquote_plus

from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from qimpl.metrics import WORKER_HEARTBEAT_INTERVAL_S

__all__ = ["UVICORN_LOGGERS", "JsonFormatter", "StreamTokenFilter", "redact_stream_tokens",
           "setup_logging", "temporal_runtime", "without_traceback"]

#: The loggers uvicorn configures with its own plain-text handlers before the app exists.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
#: ``extra`` fields never written: uvicorn's ANSI-coloured copy of the message.
_DROPPED = {"color_message"}
#: Where a formatted traceback starts inside a message (Starlette hands uvicorn a failed
#: lifespan's ``traceback.format_exc()`` as the message of "startup failed").
_TRACEBACK = re.compile(r"(?:Exception Group )?Traceback \(most recent call last\):")
#: The exception line that ends a traceback: ``package.Type: message`` or ``Type``.
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s.*)?$")


def without_traceback(msg: str) -> tuple[str, str | None]:
    """``msg`` cut before any traceback text it carries, and the type of the exception
    that traceback ends with (its message is dropped too: it may hold a secret)."""
    found = _TRACEBACK.search(msg)
    if found is None:
        return msg, None
    exc_type = "unknown"
    for line in reversed(msg[found.start():].splitlines()):
        matched = _EXC_LINE.match(line.lstrip(" |"))
        if matched:
            exc_type = matched.group(1).rsplit(".", 1)[-1]
            break
    return msg[:found.start()].rstrip(" \t\n+|") or "exception (traceback withheld)", exc_type


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and every ``extra`` field
    (``run_id``, ``event``, ...). Exceptions contribute their type only, never a trace,
    also when the trace came as message text (``without_traceback``)."""

    def format(self, record: logging.LogRecord) -> str:
        msg, traced = without_traceback(_message(record))
        doc: dict[str, object] = {
            "t": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": msg,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _DROPPED and not key.startswith("_"):
                doc[key] = value
        if traced is not None:
            doc["exc_type"] = traced
        if record.exc_info and record.exc_info[0] is not None:
            doc["exc_type"] = record.exc_info[0].__name__  # never the traceback text
        return json.dumps(doc, default=str)


def _foreign(arg: object) -> bool:
    """An exception raised outside qimpl (a library's, a server's words in its text)."""
    return isinstance(arg, BaseException) and not type(arg).__module__.startswith("qimpl.")


def _message(record: logging.LogRecord) -> str:
    """The record's message with every exception of another package among its arguments
    written as its type name: a library's ``log.warning("error connecting: %s", exc)``
    (psycopg_pool's) would otherwise put the exception's text, the server's words, in the
    line. qimpl's own exceptions keep their text (qimpl writes it, without secrets)."""
    if isinstance(record.args, tuple) and any(_foreign(a) for a in record.args):
        shown = copy.copy(record)
        shown.args = tuple(type(a).__name__ if _foreign(a) else a for a in record.args)
        return shown.getMessage()
    return record.getMessage()


@functools.cache
def temporal_runtime() -> Runtime:
    """The process's Temporal runtime, its core (Rust) logs forwarded to Python logging so
    that every line a process prints is JSON. Workers on it report themselves to Temporal
    every WORKER_HEARTBEAT_INTERVAL_S seconds: worker availability (R-OPS-6) is judged by
    those heartbeats."""
    return Runtime(
        telemetry=TelemetryConfig(logging=LoggingConfig(
            filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
            forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")))),
        worker_heartbeat_interval=timedelta(seconds=WORKER_HEARTBEAT_INTERVAL_S))


#: A query parameter in a logged URL: its separator, its raw name, its raw value.
_QUERY_PARAM = re.compile(r"([?&;])([^=&;?\s\"]+)=([^&;\s\"]*)")

#: One part of a query in a logged URL (separator, raw text up to the next separator).
_QUERY_PART = re.compile(r"([?&;])([^&;?\s\"]+)")

#: A stream token wherever it stands (``qimpl.api.stream_tokens``: ``v1.<tenant>.<run id>.
#: <expiry>.<signature>``): one sent under a misspelt name is refused, yet still good.
_TOKEN_SHAPED = re.compile(r"v1\.[A-Za-z0-9_-]+\.[0-9a-fA-F-]{36}\.[0-9]+\.[A-Za-z0-9_-]+")

#: The name of the query parameter that carries a stream token (R-EVENT-6).
_STREAM_TOKEN_NAME = "stream_token"


def redact_stream_tokens(text: str) -> str:
    """``text`` with the value of every query parameter whose name *decodes* to
    ``stream_token`` replaced by ``<redacted>`` (pure). The API decodes a parameter's name
    before it reads it (``stream%5Ftoken`` is ``stream_token`` to it), so the log must too:
    a bearer credential is never written (R-EVENT-6)."""

    def redact(m: re.Match[str]) -> str:
        sep, name, _ = m.groups()
        if unquote_plus(name) != _STREAM_TOKEN_NAME:
            return m.group(0)
        return f"{sep}{name}=<redacted>"

    def redact_encoded(m: re.Match[str]) -> str:
        # A token percent-encoded whole (``stream_token%3Dv1.…``, ``v1%2E…``): still the
        # token once decoded, and the log must not hold it (a tester's finding).
        return f"{m.group(1)}<redacted>" if _TOKEN_SHAPED.search(unquote_plus(m.group(2))) else m.group(0)

    text = _QUERY_PARAM.sub(redact, text)
    if "%" in text:
        text = _QUERY_PART.sub(redact_encoded, text)
    return _TOKEN_SHAPED.sub("<redacted>", text)


def _may_hold_a_token(text: str) -> bool:
    """Cheap pre-check: a URL with a query whose parameters may name a stream token."""
    return "v1" in text or ("=" in text and (_STREAM_TOKEN_NAME in text or "%" in text or "+" in text))


class StreamTokenFilter(logging.Filter):
    """Redacts stream tokens from a record's message and its arguments (uvicorn's access
    log passes the request path, query string included, as an argument)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and _may_hold_a_token(record.msg):
            record.msg = redact_stream_tokens(record.msg)
        if isinstance(record.args, tuple) and any(isinstance(a, str) and _may_hold_a_token(a) for a in record.args):
            record.args = tuple(redact_stream_tokens(a) if isinstance(a, str) else a for a in record.args)
        return True


def setup_logging(level: int = logging.INFO) -> None:
    """Every log line of the process as one JSON object on stdout (``JsonFormatter``).
    The API calls it when uvicorn builds the app (``create_app`` as a factory), before
    uvicorn's first line of its own; the worker first thing in ``main``.

    uvicorn installs plain-text handlers on its loggers (``UVICORN_LOGGERS``) before it
    builds the app; they are replaced with the same JSON handler here, so that uvicorn's
    lines, its start-up errors included, are JSON without tracebacks too. Their levels stay
    as uvicorn set them (``--log-level``), and a logger uvicorn left without handlers
    stays so (``--no-access-log`` empties ``uvicorn.access``: still silent). Idempotent."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(StreamTokenFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers:  # each record reaches the JSON handler once
            logger.handlers[:] = [handler]
            logger.propagate = False
