"""Every line a process writes is one JSON object, uvicorn's own lines included, and no
line carries a traceback (issue 15, item 6; docs/operations.md "Metrics" / logs)."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Iterator

import pytest
import uvicorn

from qimpl.logs import UVICORN_LOGGERS, setup_logging, without_traceback


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """uvicorn's Config and setup_logging reconfigure process-wide loggers: put them back."""
    names = ["", *UVICORN_LOGGERS]
    saved = {n: (logging.getLogger(n), list(logging.getLogger(n).handlers),
                 logging.getLogger(n).level, logging.getLogger(n).propagate) for n in names}
    yield
    for logger, handlers, level, propagate in saved.values():
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def _json_lines(text: str) -> list[dict[str, object]]:
    lines = text.splitlines()
    docs = [json.loads(line) for line in lines]  # raises on any plain-text line
    assert all(isinstance(d, dict) for d in docs)
    return docs


def test_uvicorn_lines_are_one_json_line_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    # As the harness starts the API: uvicorn configures its loggers before the app exists.
    uvicorn.Config("qimpl.api.app:create_app", factory=True, log_level="warning", access_log=False)
    setup_logging()  # what create_app does first when uvicorn calls it as a factory
    try:
        raise RuntimeError("boom: postgresql://secret@db/x")
    except RuntimeError as exc:
        logging.getLogger("uvicorn.error").error("Exception in 'lifespan' protocol\n", exc_info=exc)
    logging.getLogger("uvicorn.error").error("Application startup failed. Exiting.",
                                             extra={"color_message": "\x1b[31mfailed\x1b[0m"})
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)  # below --log-level
    logging.getLogger("uvicorn.access").info("GET / 200")  # --no-access-log: silent
    out, err = capsys.readouterr()
    assert err == ""  # uvicorn's own plain-text stderr handler no longer writes
    docs = _json_lines(out)
    assert len(docs) == 2, out
    assert docs[0] == {"t": docs[0]["t"], "level": "error", "logger": "uvicorn.error",
                       "msg": "Exception in 'lifespan' protocol\n", "exc_type": "RuntimeError"}
    assert docs[1]["msg"] == "Application startup failed. Exiting." and "color_message" not in docs[1]
    for leak in ("Traceback", 'File "', "boom", "postgresql://"):
        assert leak not in out


def test_uvicorn_access_log_is_json_when_enabled(capsys: pytest.CaptureFixture[str]) -> None:
    uvicorn.Config("qimpl.api.app:create_app", factory=True, log_level="info")
    setup_logging()
    setup_logging()  # idempotent: still one line per record
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET",
                                             "/healthz", "1.1", 200)
    logging.getLogger("uvicorn.error").info("Started server process [%d]", 7)
    logging.getLogger("qimpl.api").info("ready", extra={"run_id": "r-1"})
    out, err = capsys.readouterr()
    assert err == ""
    docs = _json_lines(out)
    assert [(d["logger"], d["msg"]) for d in docs] == [
        ("uvicorn.access", '127.0.0.1:5 - "GET /healthz HTTP/1.1" 200'),
        ("uvicorn.error", "Started server process [7]"),
        ("qimpl.api", "ready"),
    ]
    assert docs[2]["run_id"] == "r-1"


TOKEN = "v1.YWNtZQ.1265a0b1.1796556647.J63u6fMlsDCHsVYPwDtMRBSBM4WuKs4d9zvTroAdFeU"


@pytest.mark.req("R-EVENT-6")
@pytest.mark.parametrize("query", [
    f"stream_token={TOKEN}",
    f"stream%5Ftoken={TOKEN}",  # the API decodes a parameter's name before it reads it
    f"stream%5ftoken={TOKEN}",
    f"%73tream_token={TOKEN}",
    f"a=1&stream_token={TOKEN}&b=2",
    f"stream_token=x&stream_token={TOKEN}",
    f"stream_token={TOKEN.replace('.', '%2E')}",
])
def test_the_access_log_never_writes_a_stream_token(query: str, capsys: pytest.CaptureFixture[str]) -> None:
    uvicorn.Config("qimpl.api.app:create_app", factory=True, log_level="info")
    setup_logging()
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET",
                                             f"/v1/agents/a/runs/r/events?{query}", "1.1", 200)
    (doc,) = _json_lines(capsys.readouterr().out)
    assert "J63u6fMls" not in str(doc["msg"]) and "<redacted>" in str(doc["msg"]), doc["msg"]


def test_other_query_parameters_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    from qimpl.logs import redact_stream_tokens

    kept = "/v1/agents/a/runs?cursor=abc%3D&state=running&not_stream_token=1&stream_tokens=2"
    assert redact_stream_tokens(kept) == kept


def _formatted(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException:  # noqa: BLE001 - formatting it is the point
        return traceback.format_exc()


def test_a_traceback_sent_as_message_text_is_withheld(capsys: pytest.CaptureFixture[str]) -> None:
    """Starlette reports a failed lifespan to uvicorn as ``traceback.format_exc()`` text,
    which uvicorn logs as the message: the line keeps the exception's type only."""
    uvicorn.Config("qimpl.api.app:create_app", factory=True, log_level="warning", access_log=False)
    setup_logging()
    secret = "postgresql://owner:hunter2@db/qimpl"
    log = logging.getLogger("uvicorn.error")
    log.error(_formatted(TimeoutError(f"couldn't connect to {secret}")))
    log.error("startup: " + _formatted(ExceptionGroup("eg", [ValueError(secret)])))
    log.error("Application startup failed. Exiting.")
    out, err = capsys.readouterr()
    assert err == ""
    docs = _json_lines(out)
    assert [(d["msg"], d.get("exc_type")) for d in docs] == [
        ("exception (traceback withheld)", "TimeoutError"),
        ("startup:", "ValueError"),
        ("Application startup failed. Exiting.", None),
    ]
    for leak in ("Traceback", 'File "', "hunter2", "postgresql://"):
        assert leak not in out
    assert without_traceback("plain message") == ("plain message", None)


@pytest.mark.req("R-READ-3")
def test_an_exception_passed_as_an_argument_is_written_as_its_type_only() -> None:
    """psycopg_pool logs ``"error connecting in %r: %s", name, exc``: the exception's text
    (the server's words) must not reach the line, its type does."""
    from qimpl.logs import JsonFormatter

    record = logging.LogRecord("psycopg.pool", logging.WARNING, __file__, 1, "error connecting in %r: %s",
                               ("pool-1", RuntimeError('password authentication failed for user "qimpl_api"')),
                               None)
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "error connecting in 'pool-1': RuntimeError"
    assert isinstance(record.args, tuple) and isinstance(record.args[1], RuntimeError)  # other handlers unchanged


def test_qimpls_own_exceptions_keep_their_text() -> None:
    from qimpl.errors import LostOwnership
    from qimpl.logs import JsonFormatter

    record = logging.LogRecord("qimpl.activity", logging.WARNING, __file__, 1, "lost ownership: %s",
                               (LostOwnership("checkpoint 3 refused"),), None)
    assert json.loads(JsonFormatter().format(record))["msg"] == "lost ownership: checkpoint 3 refused"


@pytest.mark.req("R-EVENT-6")
@pytest.mark.parametrize("query", ["STREAM_TOKEN={t}", "stream+token={t}", "stream_token;={t}", "x={t}",
                                   "stream_token%3d{t}", "stream_token%3D{te}", "x={te}", "{te}"])
def test_a_token_under_any_name_is_redacted(query: str) -> None:
    """A token sent under a misspelt name is refused (401) yet still good: it must not sit
    in the log either (a second tester's finding)."""
    from qimpl.api.stream_tokens import mint
    from qimpl.logs import redact_stream_tokens

    token = mint(stream_key="k" * 32, tenant_id="acme", run_id="1265a0b1-2c3d-4e5f-8a9b-0c1d2e3f4a5b",
                 expires=1796556647)
    from urllib.parse import unquote_plus

    line = f'"GET /v1/agents/a/runs/r/events?{query.format(t=token, te=token.replace(".", "%2E"))} HTTP/1.1" 401'
    redacted = redact_stream_tokens(line)
    assert token not in unquote_plus(redacted) and "<redacted>" in redacted, redacted
