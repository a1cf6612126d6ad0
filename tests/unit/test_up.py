"""``qualify up --set`` (issue 25: a newcomer could not give ``qualify up`` a setting such
as the CORS allow-list: the environment's ``QIMPL_*`` are not passed on)."""

from __future__ import annotations

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
