"""``qualify up --set`` (issue 25: a newcomer could not give ``qualify up`` a setting such
as the CORS allow-list: the environment's ``QIMPL_*`` are not passed on)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_set_takes_qimpl_settings_and_refuses_the_stacks_own() -> None:
    from qualify.errors import UsageError
    from qualify.up import parse_settings

    assert parse_settings(['QIMPL_CORS_ORIGINS=["http://a"]', "QIMPL_LEASE_S=1=2"]) == {
        "QIMPL_CORS_ORIGINS": '["http://a"]', "QIMPL_LEASE_S": "1=2"}
    for bad in ("QIMPL_LEASE_S", "PATH=/tmp", "QIMPL_DATABASE_URL=postgresql://x"):
        with pytest.raises(UsageError):
            parse_settings([bad])


def test_set_refuses_a_setting_no_process_reads_and_names_the_nearest() -> None:
    """A tester's misspelt ``--set QIMPL_CORS_ORIGN=…`` was passed on and read by no one."""
    from qualify.errors import UsageError
    from qualify.up import parse_settings

    with pytest.raises(UsageError, match=r"no such setting.*did you mean QIMPL_CORS_ORIGINS"):
        parse_settings(['QIMPL_CORS_ORIGN=["http://a"]'])
    with pytest.raises(UsageError, match="no such setting"):
        parse_settings(["QIMPL_X=1"])
    # Aliases are settings too.
    assert parse_settings(["QIMPL_CONCURRENCY_LIMIT=2"]) == {"QIMPL_CONCURRENCY_LIMIT": "2"}


def test_a_port_in_use_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    """``qualify up --port P`` with P held by another server printed "qimpl is up" with that
    server's URL and a key it does not know: the API's readiness probe was answered by the
    other server while the API itself failed to bind and exited (3), twice, and then
    everything stopped (exit 2). Now a usage error, before any directory or process."""
    import socket

    from qualify.errors import UsageError
    from qualify.up import UpEnvironment, UpOptions

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        data_dir = tmp_path / "up"
        with pytest.raises(UsageError, match=rf"--port {port}: 127.0.0.1:{port} is in use"):
            UpEnvironment(UpOptions(port=port, data_dir=data_dir))
        assert not data_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the o+x rule applies to root only")
def test_an_unreachable_data_dir_is_refused_without_being_made(tmp_path: Path) -> None:
    """As root, ``qualify up --data-dir`` under a 0700 directory was refused (PostgreSQL
    runs as another user) but left the new, empty directory behind."""
    from qualify.errors import UsageError
    from qualify.up import UpEnvironment, UpOptions

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o755)
    with pytest.raises(UsageError, match="others may enter"):
        UpEnvironment(UpOptions(data_dir=private / "a" / "d"))
    assert list(private.iterdir()) == []


def test_a_tenant_api_keys_would_refuse_is_a_usage_error(tmp_path: Path) -> None:
    """``api_keys`` refuses a tenant of more than 128 bytes (its runs' stream tokens would
    be refused by the events route); ``qualify up --tenant`` made a key for one anyway."""
    from typer.testing import CliRunner

    from qualify.cli import app

    result = CliRunner().invoke(app, ["up", "--tenant", "t" * 129, "--data-dir", str(tmp_path / "up")])
    assert result.exit_code == 2 and "--tenant is longer than 128 bytes" in result.output
    assert not (tmp_path / "up").exists()


def test_a_provider_module_that_does_not_exist_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    """A new user's finding: ``qualify up --provider mypkg.myprovider:factory`` with a typo
    in the module booted PostgreSQL and Temporal, migrated, started the API and the worker,
    and only then stopped everything, exit 2 ("harness error: worker-1: process exited
    with 64 before ready …"). A module that cannot be found is a usage error (exit 64) at
    once, nothing started, nothing written."""
    from typer.testing import CliRunner

    from qualify.cli import app

    result = CliRunner().invoke(app, ["up", "--provider", "nosuch_module_xyz.sub:factory",
                                      "--data-dir", str(tmp_path / "up")])
    assert result.exit_code == 64, result.output
    assert "cannot import module 'nosuch_module_xyz.sub'" in result.output
    assert not (tmp_path / "up").exists()
