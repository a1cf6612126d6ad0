"""``qualify up --data-dir`` on a kept directory whose key was disabled since (issue 59,
item 6): it printed the kept key, which answers 401; it must mint a new one and say so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from qimpl.db import admin
from qualify.up import UpOptions, provision


def _live(dsn: str, key: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return any(k["key_id"] == admin.key_id(key) for k in admin.list_api_keys(conn))


def test_a_kept_key_that_was_disabled_is_replaced(stack: Any, tmp_path: Path) -> None:
    dsn = str(stack.create_database())
    creds = tmp_path / "credentials.json"
    opts = UpOptions(data_dir=tmp_path)
    first, replaced = provision(dsn, creds, opts, fresh=True)
    assert replaced == "" and _live(dsn, first)
    again, replaced = provision(dsn, creds, opts, fresh=False)   # a restart keeps a live key
    assert (again, replaced) == (first, "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert admin.disable_api_key(conn, key_id=admin.key_id(first), actor="test") is True
    key, replaced = provision(dsn, creds, opts, fresh=False)
    assert replaced == admin.key_id(first) and key != first
    assert _live(dsn, key) and not _live(dsn, first)
    assert json.loads(creds.read_text())["api_key"] == key    # the next restart keeps the new one
    assert provision(dsn, creds, opts, fresh=False) == (key, "")
