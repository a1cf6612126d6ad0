"""A new user's finding: an operator command given an argument that is not valid UTF-8
(``--tenant "$(printf 'a\\xffb')"``: Python holds such bytes as lone surrogates) printed a
``UnicodeEncodeError`` traceback and exited 1 (``agent_runs``, ``api_keys create``) or 1
(``qualify up --tenant`` / ``--principal``). It is a usage error: exit 64, one line, no
traceback, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest

from qimpl.scripts import EXIT_USAGE

NOT_UTF8 = b"a\xffb".decode("utf-8", "surrogateescape")


@pytest.mark.req("R-OPS-4")
def test_agent_runs_refuses_an_argument_that_is_not_utf8(capsys: pytest.CaptureFixture[str]) -> None:
    from qimpl.scripts import agent_runs

    with pytest.raises(SystemExit) as done:
        agent_runs.main(["--tenant", "acme", "--tenant", NOT_UTF8])
    assert done.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "not valid UTF-8" in err and "Traceback" not in err


@pytest.mark.req("R-AUTH-1")
@pytest.mark.parametrize("argv", [["create", "--tenant", NOT_UTF8, "--principal", "p"],
                                  ["create", "--tenant", "t", "--principal", NOT_UTF8],
                                  ["list", "--tenant", NOT_UTF8]])
def test_api_keys_refuses_an_argument_that_is_not_utf8(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from qimpl.scripts import api_keys

    with pytest.raises(SystemExit) as done:
        api_keys.main(argv)
    assert done.value.code == EXIT_USAGE
    assert "not valid UTF-8" in capsys.readouterr().err


def test_tenant_problem_names_a_tenant_that_is_not_utf8() -> None:
    from qimpl.settings import tenant_problem

    assert tenant_problem(NOT_UTF8) == "is not valid UTF-8"
    assert tenant_problem("acme") is None


@pytest.mark.parametrize("option", ["--tenant", "--principal", "--workspace"])
def test_qualify_up_refuses_a_name_that_is_not_utf8(tmp_path: Path, option: str) -> None:
    from typer.testing import CliRunner

    from qualify.cli import app

    result = CliRunner().invoke(app, ["up", option, NOT_UTF8, "--data-dir", str(tmp_path / "up")])
    assert result.exit_code == 2 and f"{option} is not valid UTF-8" in result.output, result.output
    assert not (tmp_path / "up").exists()
