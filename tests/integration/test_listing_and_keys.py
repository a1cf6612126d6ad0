"""Run listings and key administration against the real database, in process (issue 25,
items 10 and 11): a client lists its own runs a page at a time (R-READ-5, R-AUTH-1); an
operator lists runs across the tenants its key is assigned (R-READ-5, R-OPS-7); a key
is listed by its public id, disabled for good, rotated, and every change is audited
(R-AUTH-1)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg
import pytest

from qimpl.db import admin
from qimpl.scripts import api_keys
from tests.integration.api_in_process import with_api

Client = httpx.AsyncClient


@pytest.fixture
def db(stack: Any) -> str:
    return str(stack.create_database())


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _create(client: Client, key: str, idem: str, agent: str = "a-1") -> str:
    resp = await client.post(f"/v1/agents/{agent}/runs", json={"prompt": "hello", "durable_temporal": True},
                             headers={**_auth(key), "Idempotency-Key": idem})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["run_id"])


async def _all_pages(client: Client, path: str, key: str, **params: Any) -> tuple[list[list[dict[str, Any]]], Any]:
    pages, cursor, doc = [], None, None
    while True:
        resp = await client.get(path, params={**params, **({"cursor": cursor} if cursor else {})},
                                headers=_auth(key))
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        pages.append(doc["runs"])
        cursor = doc["next_cursor"]
        if cursor is None:
            return pages, doc
        assert len(pages) < 20, "pagination does not end"


@pytest.mark.req("R-READ-5", "R-AUTH-1")
def test_a_client_lists_its_own_runs_a_page_at_a_time(db: str, stack: Any) -> None:
    async def test(client: Client) -> None:
        mine = [await _create(client, "dev-key", f"mine-{i}") for i in range(5)]
        other_agent = await _create(client, "dev-key", "mine-other-agent", agent="a-2")
        peers = await _create(client, "peer-key", "peer-0")
        others = await _create(client, "other-key", "other-0")
        pages, _ = await _all_pages(client, "/v1/agents/a-1/runs", "dev-key", limit=2)
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [r["run_id"] for p in pages for r in p]
        assert listed == list(reversed(mine)), "newest first, each run once, only the caller's of this agent"
        assert not {other_agent, peers, others} & set(listed)
        queued, _ = await _all_pages(client, "/v1/agents/a-1/runs", "dev-key", state=["queued", "running"])
        assert sorted(r["run_id"] for r in queued[0]) == sorted(mine)
        none, _ = await _all_pages(client, "/v1/agents/a-1/runs", "dev-key", state="completed")
        assert none == [[]]
        peer_pages, _ = await _all_pages(client, "/v1/agents/a-1/runs", "peer-key")
        assert [r["run_id"] for r in peer_pages[0]] == [peers]
        for params, code in (({"cursor": "bm90LWEtY3Vyc29y"}, "cursor_invalid"),
                             ({"cursor": "%%%"}, "cursor_invalid"),
                             ({"limit": 0}, "invalid_parameter"), ({"limit": 201}, "invalid_parameter"),
                             ({"state": "bogus"}, "invalid_parameter")):
            bad = await client.get("/v1/agents/a-1/runs", params=params, headers=_auth("dev-key"))
            assert (bad.status_code, bad.json()["code"]) == (422, code), (params, bad.text)
        operator = await client.get("/v1/agents/a-1/runs", headers=_auth("ops-key"))
        assert (operator.status_code, operator.json()["code"]) == (403, "client_credential_required")
        anonymous = await client.get("/v1/agents/a-1/runs")
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "unauthenticated")

    with_api(db, stack, test, queue_prefix="list")


@pytest.mark.req("R-READ-5", "R-OPS-7", "R-AUTH-4")
def test_an_operator_lists_runs_across_its_assigned_tenants(db: str, stack: Any) -> None:
    ops = admin.key_id("ops-key")

    async def test(client: Client) -> None:
        dev = [await _create(client, "dev-key", f"d-{i}") for i in range(4)]
        other = [await _create(client, "other-key", f"o-{i}") for i in range(3)]
        pages, doc = await _all_pages(client, "/v1/operator/runs", "ops-key")
        assert doc["tenants"] == ["t-dev"]
        assert [r["run_id"] for p in pages for r in p] == dev, "its own tenant only, oldest first"
        with psycopg.connect(db, autocommit=True) as conn:
            assert admin.assign_tenant(conn, key_id=ops, tenant_id="t-other", actor="test") is True
            assert ops in {k["key_id"] for k in admin.list_api_keys(conn, tenant_id="t-other")}
        pages, doc = await _all_pages(client, "/v1/operator/runs", "ops-key", limit=3)
        assert doc["tenants"] == ["t-dev", "t-other"]
        assert [len(p) for p in pages] == [3, 3, 1]
        rows = [r for p in pages for r in p]
        assert [r["run_id"] for r in rows] == dev + other, "merged across tenants in accepted order"
        assert {r["run_id"]: r["tenant_id"] for r in rows} == {**dict.fromkeys(dev, "t-dev"),
                                                              **dict.fromkeys(other, "t-other")}
        assert all(r["age_s"] >= 0 and 0 < r["deadline_in_s"] <= 3600 for r in rows)
        assert not any(r["awaiting_reconciliation"] for r in rows)
        one, _ = await _all_pages(client, "/v1/operator/runs", "ops-key", tenant="t-other")
        assert [r["run_id"] for r in one[0]] == other
        for params, n in (({"accepted_before_s": 3600}, 0), ({"deadline_within_s": 7200}, 7),
                          ({"deadline_within_s": 0}, 0), ({"awaiting_reconciliation": "true"}, 0),
                          ({"awaiting_reconciliation": "false"}, 7), ({"state": "queued"}, 7)):
            got, _ = await _all_pages(client, "/v1/operator/runs", "ops-key", **params)
            assert sum(map(len, got)) == n, params
        refused = await client.get("/v1/operator/runs", params={"tenant": "t-third"}, headers=_auth("ops-key"))
        assert (refused.status_code, refused.json()["code"]) == (403, "tenant_not_assigned")
        journal = await client.get(f"/v1/operator/runs/{other[0]}/tool-invocations", headers=_auth("ops-key"))
        assert journal.status_code == 200, journal.text
        client_key = await client.get("/v1/operator/runs", headers=_auth("dev-key"))
        assert (client_key.status_code, client_key.json()["code"]) == (403, "operator_credential_required")
        theirs, _ = await _all_pages(client, "/v1/operator/runs", "ops-other-key")
        assert [r["run_id"] for r in theirs[0]] == other
        with psycopg.connect(db, autocommit=True) as conn:
            assert admin.unassign_tenant(conn, key_id=ops, tenant_id="t-other", actor="test") is True
        pages, doc = await _all_pages(client, "/v1/operator/runs", "ops-key")
        assert doc["tenants"] == ["t-dev"] and [r["run_id"] for p in pages for r in p] == dev
        gone = await client.get(f"/v1/operator/runs/{other[0]}/tool-invocations", headers=_auth("ops-key"))
        assert (gone.status_code, gone.json()["code"]) == (404, "run_not_found")

    with_api(db, stack, test, queue_prefix="list")


@pytest.mark.req("R-AUTH-1")
def test_a_key_is_listed_disabled_for_good_rotated_and_audited(
        db: str, stack: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    leaked = "leaked-key-0123456789abcdef"
    with psycopg.connect(db, autocommit=True) as conn:
        admin.create_api_key(conn, key=leaked, tenant_id="t-dev", principal_id="p-dev", actor="alice")
    leaked_id = admin.key_id(leaked)
    rotated: dict[str, str] = {}

    async def test(client: Client) -> None:
        assert (await client.get("/v1/agents/a-1/runs", headers=_auth(leaked))).status_code == 200
        with psycopg.connect(db, autocommit=True) as conn:
            assert admin.disable_api_key(conn, key_id=leaked_id, actor="alice") is True
            assert admin.disable_api_key(conn, key_id=leaked_id, actor="alice") is False
            with pytest.raises(admin.KeyNotFound):
                admin.disable_api_key(conn, key_id="key_000000000000", actor="alice")
            with pytest.raises(psycopg.Error) as err:  # a disabled key stays disabled
                conn.execute("UPDATE api_keys SET revoked_at = NULL WHERE key_id = %s", (leaked_id,))
            assert err.value.sqlstate == "QG016"
            with pytest.raises(ValueError, match="disabled"):
                admin.rotate_api_key(conn, key_id=leaked_id, new_key="x" * 32, actor="alice")
        refused = await client.get("/v1/agents/a-1/runs", headers=_auth(leaked))
        assert (refused.status_code, refused.json()["code"]) == (401, "unauthenticated")
        # Rotation with a grace period: both keys work until the old one's expiry, then only the new.
        with psycopg.connect(db, autocommit=True) as conn:
            old_id = admin.key_id("dev-key")
            new_id = admin.rotate_api_key(conn, key_id=old_id, new_key="rotated-dev-key-0123456789",
                                          actor="bob", grace_s=30)
            rotated["id"] = new_id
        for key in ("dev-key", "rotated-dev-key-0123456789"):
            assert (await client.get("/v1/agents/a-1/runs", headers=_auth(key))).status_code == 200
        with psycopg.connect(db, autocommit=True) as conn:
            states = {k["key_id"]: k["state"] for k in admin.list_api_keys(conn, tenant_id="t-dev")}
            assert states[old_id] == "expiring" and states[new_id] == "live"
            assert leaked_id not in states
            everything = {k["key_id"]: k["state"] for k in admin.list_api_keys(conn, include_disabled=True)}
            assert everything[leaked_id] == "disabled"
            conn.execute("UPDATE api_keys SET expires_at = clock_timestamp() WHERE key_id = %s", (old_id,))
        expired = await client.get("/v1/agents/a-1/runs", headers=_auth("dev-key"))
        assert (expired.status_code, expired.json()["code"]) == (401, "unauthenticated")
        assert (await client.get("/v1/agents/a-1/runs",
                                 headers=_auth("rotated-dev-key-0123456789"))).status_code == 200

    with_api(db, stack, test, queue_prefix="list")
    with psycopg.connect(db, autocommit=True) as conn:
        audit = admin.key_audit(conn)
        by_key = [(a["key_id"], a["action"], a["actor"]) for a in reversed(audit)
                  if a["key_id"] in (leaked_id, admin.key_id("dev-key"), rotated["id"])]
        assert (leaked_id, "created", "alice") in by_key
        assert by_key.count((leaked_id, "disabled", "alice")) == 1, "a repeated disable is not audited twice"
        assert (rotated["id"], "created", "bob") in by_key
        assert (admin.key_id("dev-key"), "expiry_set", "bob") in by_key
        assert all(a["at"] is not None for a in audit)
        rotation = next(a for a in audit if a["action"] == "rotated" and a["key_id"] == admin.key_id("dev-key"))
        assert rotation["detail"] == {"replaced_by": rotated["id"], "grace_s": 30} and rotation["actor"] == "bob"
        with pytest.raises(psycopg.Error) as err:
            conn.execute("DELETE FROM api_key_audit")
        assert err.value.sqlstate == "QG017"
    # The command line: the list shows ids, never a key or its hash.
    monkeypatch.setenv("QIMPL_ADMIN_DATABASE_URL", db)
    assert api_keys.main(["list", "--all", "--json"]) == 0
    out = capsys.readouterr().out
    listed = json.loads(out)
    assert {k["key_id"] for k in listed} >= {leaked_id, rotated["id"]}
    assert "dev-key" not in out and admin.key_hash("dev-key") not in out and leaked not in out
    assert api_keys.main(["--actor", "carol", "disable", "--key-id", rotated["id"]]) == 0
    assert api_keys.main(["disable", "--key-id", "key_nope"]) == 1
    assert api_keys.main(["audit", "--key-id", rotated["id"]]) == 0
    assert "carol" in capsys.readouterr().out
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("DELETE FROM api_keys WHERE key_id = %s", (leaked_id,))  # as from psql
        gone = admin.key_audit(conn, key_id=leaked_id, limit=1)[0]
        assert gone["action"] == "deleted" and gone["actor"], gone


@pytest.mark.req("R-OPS-3")
def test_a_key_for_a_tenant_no_reconciler_sweeps_warns(
        db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A tenant listed in no worker's DURABLE_AGENT_RECONCILE_TENANTS is never swept; the
    key still works, but creating it says so (stderr), and stops saying so once a
    reconciler has swept the tenant lately."""
    monkeypatch.setenv("QIMPL_ADMIN_DATABASE_URL", db)
    assert api_keys.main(["create", "--tenant", "t-new", "--principal", "p-1"]) == 0
    err = capsys.readouterr().err
    assert "no reconciler has swept tenant 't-new' ever" in err and "DURABLE_AGENT_RECONCILE_TENANTS" in err
    with psycopg.connect(db, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT set_config('qimpl.tenant', 't-new', true)")
        conn.execute("INSERT INTO reconciler_sweeps (reconciler, tenant_id, started_at, finished_at,"
                     " candidates, expired, dispatched, errors)"
                     " VALUES ('w-1', 't-new', now() - interval '10 minutes',"
                     " now() - interval '10 minutes', 0, 0, 0, 0)")
    assert api_keys.main(["create", "--tenant", "t-new", "--principal", "p-2"]) == 0
    assert "no reconciler has swept tenant 't-new' for 6" in capsys.readouterr().err
    with psycopg.connect(db, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT set_config('qimpl.tenant', 't-new', true)")
        conn.execute("INSERT INTO reconciler_sweeps (reconciler, tenant_id, started_at, candidates,"
                     " expired, dispatched, errors) VALUES ('w-1', 't-new', now(), 0, 0, 0, 0)")
    assert api_keys.main(["create", "--tenant", "t-new", "--principal", "p-3"]) == 0
    err = capsys.readouterr().err
    assert "key_id key_" in err and "warning" not in err
