"""The API's security surface against the real database, in process (issue 13): ``/metrics``
is an operator surface showing the operator's own tenant only, through an indexed
per-tenant query (R-OPS-7); a same-key replay after a revoke returns the original
receipt while new work is still authorised (R-CREATE-2, R-AUTH-2)."""

from __future__ import annotations

import base64
import re
from typing import Any

import httpx
import psycopg
import pytest

from qimpl.api.deps import Services
from qimpl.db import admin
from qimpl.metrics import RUN_STATS_SQL
from qualify.stack._embedded import API_ROLE, with_user
from tests.integration.api_in_process import with_api

Client = httpx.AsyncClient


@pytest.fixture
def db(stack: Any) -> str:
    return str(stack.create_database())


async def _create(client: Client, key: str, idem: str, prompt: str = "hello") -> httpx.Response:
    return await client.post("/v1/agents/a-1/runs", json={"prompt": prompt, "durable_temporal": True},
                             headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem})


@pytest.mark.req("R-OPS-7")
@pytest.mark.req("R-AUTH-4")
def test_metrics_need_an_operator_key_and_show_its_tenant_only(db: str, stack: Any) -> None:
    async def test(client: Client) -> None:
        for key in ("dev-key", "other-key"):
            assert (await _create(client, key, f"m-{key}")).status_code == 202
        anonymous = await client.get("/metrics")
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "unauthenticated")
        assert "t-dev" not in anonymous.text and "qimpl_runs" not in anonymous.text
        for key in ("dev-key", "other-key"):
            refused = await client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert (refused.status_code, refused.json()["code"]) == (403, "operator_credential_required")
        for key, tenant in (("ops-key", "t-dev"), ("ops-other-key", "t-other")):
            scrape = await client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
            assert scrape.status_code == 200
            assert set(re.findall(r'tenant="([^"]*)"', scrape.text)) == {tenant}, scrape.text
            assert f'qimpl_runs{{state="queued",tenant="{tenant}"}} 1.0' in scrape.text
            assert f'qimpl_oldest_accepted_run_age_seconds{{tenant="{tenant}"}} 0.0' in scrape.text

    with_api(db, stack, test, queue_prefix="sec")


@pytest.mark.req("R-OPS-7")
def test_metrics_aggregate_is_an_index_only_scan_of_one_tenant(db: str) -> None:
    with psycopg.connect(with_user(db, API_ROLE), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction):  # no cross-tenant aggregate
            conn.execute("SELECT * FROM qimpl_run_stats()")
    with psycopg.connect(with_user(db, API_ROLE)) as conn:
        conn.execute("SELECT set_config('qimpl.tenant', 't-dev', true)")
        conn.execute("SET LOCAL enable_seqscan = off")  # tiny table: show the index serves it
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + RUN_STATS_SQL, ("t-dev",)))
    assert "Index Only Scan using runs_tenant_state_accepted" in plan, plan
    assert "Seq Scan" not in plan, plan


@pytest.mark.req("R-CREATE-2")
@pytest.mark.req("R-AUTH-2")
def test_same_key_after_revoke_replays_the_original_receipt(db: str, stack: Any) -> None:
    async def test(client: Client) -> None:
        first = await _create(client, "dev-key", "K")
        assert first.status_code == 202, first.text
        with psycopg.connect(db, autocommit=True) as conn:
            assert admin.revoke_workspace(conn, tenant_id="t-dev", principal_id="p-dev",
                                          workspace_id="default") == 1
        again = await _create(client, "dev-key", "K")
        assert again.status_code == 202, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == first.json()
        fresh = await _create(client, "dev-key", "K2")
        assert (fresh.status_code, fresh.json()["code"]) == (403, "workspace_access_denied")
        other_body = await _create(client, "dev-key", "K", prompt="another")
        assert (other_body.status_code, other_body.json()["code"]) == (422, "idempotency_key_reused")

    with_api(db, stack, test, queue_prefix="sec")
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)




@pytest.mark.req("R-CREATE-5")
@pytest.mark.parametrize("failing", ["confirm_dispatch", "complete_idempotency"])
def test_a_database_failure_after_acceptance_returns_the_receipt(
        db: str, stack: Any, failing: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run is committed, then the database fails while the API records its dispatch or
    completes the key's record: 503 ``durable_dispatch_unknown`` with the receipt, never a
    bare 500; a retry with the same key settles it."""
    from qimpl.db import runs as repo

    real = getattr(repo, failing)
    calls = {"n": 0}

    async def broken(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(*args, **kwargs)

    monkeypatch.setattr(repo, failing, broken)

    async def test(client: Client) -> None:
        first = await _create(client, "dev-key", f"db-{failing}")
        body = first.json()
        assert (first.status_code, body["code"]) == (503, "durable_dispatch_unknown"), first.text
        run_id = body["receipt"]["run_id"]
        again = await _create(client, "dev-key", f"db-{failing}")
        assert again.status_code == 202 and again.json()["run_id"] == run_id, again.text

    with_api(db, stack, test, queue_prefix="sec")


@pytest.mark.req("R-OPS-7", "R-AUTH-1")
def test_an_operator_key_is_not_a_client_key(db: str, stack: Any) -> None:
    """Operator keys reach the operator surfaces only: a client route answers 403
    ``client_credential_required`` (and runs nothing, ``/v1/answer`` included)."""
    async def test(client: Client) -> None:
        created = await _create(client, "ops-key", "ops-create")
        assert (created.status_code, created.json()["code"]) == (403, "client_credential_required")
        answered = await client.post("/v1/answer", json={"prompt": "hi"},
                                     headers={"Authorization": "Bearer ops-key"})
        assert (answered.status_code, answered.json()["code"]) == (403, "client_credential_required")
        assert (await _create(client, "dev-key", "dev-create")).status_code == 202

    with_api(db, stack, test, queue_prefix="sec")


@pytest.mark.req("R-AUTH-1")
def test_a_write_looks_its_key_up_once(db: str, stack: Any) -> None:
    """The body-size guard authenticates a write's key before reading its body; the route
    reuses that answer for the same request and key instead of asking the database again.
    Another request, or another key, is looked up afresh (a revoked key is refused at its
    next request)."""
    lookups: list[str] = []

    def count(services: Services) -> None:
        authenticate = services.authenticator.authenticate

        async def counted(key: str) -> Any:
            lookups.append(key)
            return await authenticate(key)

        services.authenticator.authenticate = counted  # type: ignore[method-assign]

    async def test(client: Client) -> None:
        assert (await _create(client, "dev-key", "once-1")).status_code == 202
        assert lookups == ["dev-key"]
        assert (await _create(client, "dev-key", "once-2")).status_code == 202
        assert lookups == ["dev-key", "dev-key"]
        created = await _create(client, "ops-key", "once-3")
        assert (created.status_code, created.json()["code"]) == (403, "client_credential_required")
        assert (await _create(client, "no-such-key", "once-4")).status_code == 401

    with_api(db, stack, test, queue_prefix="sec", services_hook=count)


@pytest.mark.req("R-AUTH-1")
def test_a_chosen_key_cannot_be_given_to_a_second_principal(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        admin.create_api_key(conn, key="k-0123456789abcdefghijklmn", tenant_id="t-dev", principal_id="p-y")
        admin.create_api_key(conn, key="k-0123456789abcdefghijklmn", tenant_id="t-dev", principal_id="p-y")
        with pytest.raises(ValueError, match="already exists"):
            admin.create_api_key(conn, key="k-0123456789abcdefghijklmn", tenant_id="t-dev",
                                 principal_id="p-z")


@pytest.mark.req("R-CREATE-1")
def test_an_agent_id_of_dots_only_is_refused(db: str, stack: Any) -> None:
    """``.`` and ``..`` are path segments a client collapses: a run created under one could
    not be read back through a normal client (a tester's finding). 422
    ``invalid_parameter``, nothing written; an id with a dot among other characters stays
    valid."""
    async def test(client: Client) -> None:
        headers = {"Authorization": "Bearer dev-key"}
        body = {"prompt": "x", "durable_temporal": True}
        for raw in ("%2E", "%2E%2E", "%2E%2E%2E"):
            refused = await client.post(f"/v1/agents/{raw}/runs", json=body,
                                        headers={**headers, "Idempotency-Key": f"dots-{raw}"})
            assert (refused.status_code, refused.json()["code"]) == (422, "invalid_parameter"), refused.text
        kept = await client.post("/v1/agents/a.b/runs", json=body, headers={**headers, "Idempotency-Key": "a.b"})
        assert kept.status_code == 202, kept.text
        with psycopg.connect(db) as conn:
            agents = [r[0] for r in conn.execute("SELECT agent_id FROM runs")]
        assert agents == ["a.b"]

    with_api(db, stack, test, queue_prefix="dots")


@pytest.mark.req("R-CREATE-1")
def test_a_body_of_many_unknown_fields_is_one_problem(db: str, stack: Any) -> None:
    """A 1 MiB body of 100,000 unknown fields was answered with every one of them (9.6 MB),
    and eight such requests stalled the API for its other clients (a tester's finding)."""
    async def test(client: Client) -> None:
        body = {"prompt": "x", "durable_temporal": True, **{f"f{i}": 0 for i in range(5000)}}
        refused = await client.post("/v1/agents/a-1/runs", json=body,
                                    headers={"Authorization": "Bearer dev-key", "Idempotency-Key": "many"})
        doc = refused.json()
        assert (refused.status_code, doc["code"], len(doc["errors"])) == (422, "unknown_field", 1), doc
        assert "5000 unknown fields" in doc["errors"][0]["msg"] and len(refused.content) < 1000
        with psycopg.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)

    with_api(db, stack, test, queue_prefix="many")


@pytest.mark.req("R-AUTH-3")
def test_an_authorization_header_on_the_events_route_is_never_ignored(db: str, stack: Any) -> None:
    """The stream key is the events route's credential, and ``Authorization`` is optional
    there; one sent was ignored, so an unknown key and another tenant's key both streamed
    (a tester's finding). Now: unknown 401, another tenant's 404 as for no run, the run's
    own tenant (another principal too: the stream key is shared on purpose) streams."""
    async def test(client: Client) -> None:
        created = await _create(client, "dev-key", "events-auth")
        run_id, stream_key = created.json()["run_id"], created.json()["stream_key"]
        url = f"/v1/agents/a-1/runs/{run_id}/events"

        async def status(authorization: str | None) -> tuple[int, str | None]:
            # HEAD: the GET's status and headers, the stream ended at once (the in-process
            # transport would wait for a live stream's end); then the refusal's code by GET.
            headers = {"X-Stream-Key": stream_key}
            if authorization is not None:
                headers["Authorization"] = authorization
            head = await client.head(url, headers=headers)
            if head.status_code == 200:
                return 200, None
            return head.status_code, (await client.get(url, headers=headers)).json().get("code")

        assert await status("Bearer no-such-key") == (401, "unauthenticated")
        assert await status("") == (401, "unauthenticated")
        assert await status("Bearer other-key") == (404, "run_not_found")
        assert await status("Bearer dev-key") == (200, None)
        assert await status("Bearer peer-key") == (200, None)
        assert await status(None) == (200, None)

    with_api(db, stack, test, queue_prefix="evauth")


@pytest.mark.req("R-EVENT-6")
@pytest.mark.req("R-AUTH-3")
def test_a_forged_stream_token_is_refused_before_its_tenant_is_used(db: str, stack: Any) -> None:
    """A stream token whose tenant part held a NUL answered 422 ``value_unstorable``: the
    token's tenant reached ``set_config`` before its MAC was checked (issue 56, item 12).
    A forged token is 401 ``stream_token_invalid`` whatever its tenant says: a NUL,
    another tenant's name, the run's own tenant under a made-up MAC; the run's real
    token still streams."""
    async def test(client: Client) -> None:
        created = await _create(client, "dev-key", "forged-token")
        run_id = created.json()["run_id"]
        minted = await client.post(f"/v1/agents/a-1/runs/{run_id}/stream-token",
                                   headers={"Authorization": "Bearer dev-key"}, json={})
        assert minted.status_code == 200, minted.text
        token = minted.json()["token"]
        version, _tenant, run, expires, mac = token.split(".")
        url = f"/v1/agents/a-1/runs/{run_id}/events"
        for tenant in ("t-dev\x00", "\x00", "t-other", "t-dev"):
            forged_mac = mac if tenant != "t-dev" else "A" * len(mac)
            forged = ".".join((version, base64.urlsafe_b64encode(tenant.encode()).decode().rstrip("="),
                               run, expires, forged_mac))
            answer = await client.get(url, params={"stream_token": forged})
            assert answer.status_code == 401, (repr(tenant), answer.status_code, answer.text)
            assert answer.json()["code"] == "stream_token_invalid", (repr(tenant), answer.text)
            assert "Traceback" not in answer.text
        assert (await client.head(url, params={"stream_token": token})).status_code == 200

    with_api(db, stack, test, queue_prefix="forged")
