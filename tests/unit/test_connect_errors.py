"""A failed connect tells a refused login from a server out of reach (a new user's
finding: a wrong password was reported as "cannot reach the database")."""

from __future__ import annotations

import psycopg
import pytest

from qimpl.db.connect_errors import ConnectProblem, connect_problem


@pytest.mark.req("R-OPS-4")
@pytest.mark.parametrize("text, summary", [
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  password '
     'authentication failed for user "qimpl_api"',
     'the database refused the connection: password authentication failed for user "qimpl_api"'),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  role "x" '
     'does not exist\nconnection to server at "::1" failed: FATAL:  role "x" does not exist',
     'the database refused the connection: role "x" does not exist'),
    ('connection failed: ... failed: FATAL:  la base de données « nodb » n\'existe pas',
     "the database refused the connection: la base de données « nodb » n'existe pas"),
], ids=["password", "role-two-addresses", "another-language"])
def test_a_server_that_answered_and_refused_is_quoted(text: str, summary: str) -> None:
    assert connect_problem(psycopg.OperationalError(text)) == ConnectProblem("database_refused", summary)


@pytest.mark.req("R-OPS-4")
def test_anything_else_is_out_of_reach_and_named_by_its_type_only() -> None:
    refused = psycopg.OperationalError('connection failed: connection to server at "10.0.0.9", port 1 '
                                       "failed: Connection refused\n\tIs the server running on that host?")
    assert connect_problem(refused) == ConnectProblem("database_unreachable",
                                                      "cannot reach the database: OperationalError")
    assert connect_problem(TimeoutError()).summary == "cannot reach the database: TimeoutError"


def test_a_long_server_line_is_cut() -> None:
    problem = connect_problem(psycopg.OperationalError("FATAL:  " + "x" * 1000))
    assert len(problem.summary) < 300
