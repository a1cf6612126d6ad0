"""Developer sessions: ``nox -s tests``, ``nox -s qualify``, ``nox -s lint``."""

import nox

nox.options.sessions = ["lint", "tests"]


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session(python="3.11")
def qualify(session: nox.Session) -> None:
    session.install("-e", ".")
    session.run("qualify", "run", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("-e", ".[dev]")
    session.run("ruff", "check", "qimpl", "qualify", "tests", "bench")
    session.run("mypy", "qimpl", "qualify")
