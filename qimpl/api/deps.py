"""What every route shares: the process's services (pool, Temporal client, provider),
the authenticated principal and the run it owns (R-AUTH-1, R-AUTH-4, R-OPS-7)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
from fastapi import Depends, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from temporalio.client import Client

from qimpl.api.auth import Authenticator, DbKeyAuthenticator, Principal, StaticKeyAuthenticator
from qimpl.api.errors import ApiError
from qimpl.api.event_hub import EventHub
from qimpl.db import runs as repo
from qimpl.db.checkout import RECONNECT_TIMEOUT_S, checkout
from qimpl.db.connect_errors import ConnectProblem, connect_problem
from qimpl.db.sessions import bound_session, cut_after, keepalive_params
from qimpl.legacy import run_inline
from qimpl.logs import temporal_runtime
from qimpl.provider import Provider, load_provider
from qimpl.settings import ApiSettings

log = logging.getLogger("qimpl.api")

__all__ = ["BEARER", "AgentId", "CurrentPrincipal", "OperatorPrincipal", "Services", "Svc",
           "operator_principal", "owned_run", "principal_of", "services_of"]

#: Agent ids and idempotency keys are printable identifiers (no control characters).
#: An agent id: letters, digits and ``._:@-``, with at least one that is not a dot (``.`` and
#: ``..`` are path segments a client collapses: a run created under one could not be read
#: back through a normal client, a tester's finding).
AgentId = Annotated[str, Path(min_length=1, max_length=128,
                              pattern=r"^[A-Za-z0-9._:@-]*[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*$")]

#: The bearer scheme of ``components.securitySchemes``. It only documents: it never
#: rejects a request; ``_principal`` answers 401 ``unauthenticated`` itself (R-AUTH-1).
BEARER = HTTPBearer(
    scheme_name="bearer", bearerFormat="API key", auto_error=False,
    description="An API key: `Authorization: Bearer <key>`. Missing or unknown: 401 "
                "`unauthenticated` (R-AUTH-1).")


#: Longest the pool's own statement on a connection may take (its check on checkout),
#: seconds: a server that stops answering fails it, and the pool replaces the
#: connection, instead of hanging the request.
POOL_STATEMENT_S = 2.0


async def _check_and_forget_tenant(conn: Any) -> None:
    """Pool check on checkout, bounded: the connection answers, and carries no tenant of
    an earlier request into this one (R-AUTH-4; the routes scope theirs to a transaction,
    ``Services.tenant``, so this only guards against a session-level scope). One round
    trip: until issue 21 the check was an empty query and a pool reset on return cleared
    the tenant, two statements on each of a POST's three checkouts."""
    async with cut_after(conn, POOL_STATEMENT_S):
        await conn.execute("SELECT set_config('qimpl.tenant', '', false)")


class Services:
    """Process-wide resources, created in the lifespan."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.pool = AsyncConnectionPool(
            settings.database_url, min_size=1, max_size=settings.api_pool_size, open=False,
            # A request waits at most this long for a connection: then 503, not a hang.
            timeout=settings.api_pool_timeout_s,
            # After an outage, connections as soon as the server is back (RECONNECT_TIMEOUT_S).
            reconnect_timeout=RECONNECT_TIMEOUT_S,
            kwargs={"autocommit": True, "application_name": "qimpl-api",
                    **keepalive_params(settings.api_lock_timeout_s)},
            # Every session waits at most api_lock_timeout_s for a run's row and is ended by
            # PostgreSQL if this process stalls inside a transaction that long (R-EXEC-11).
            configure=functools.partial(bound_session, lock_timeout_s=settings.api_lock_timeout_s),
            # Checked on checkout by ``connection`` (``_check_and_forget_tenant``): a
            # connection that died while idle (a server restart) is replaced instead of
            # failing the request, and the next tried at once (``qimpl.db.checkout``; the
            # pool's own ``check=`` waits 1 s, 2 s, 4 s ... between dead ones); none
            # carries an earlier request's tenant.
        )
        self.authenticator: Authenticator = (
            StaticKeyAuthenticator(settings.api_keys) if settings.auth == "static"
            else DbKeyAuthenticator(self.connection))
        #: Event streams' journal reads in flight at once: half the pool (at least one), so that many
        #: streams woken together (one commit, or a burst of them) queue here rather than
        #: for the pool, where the control routes would wait behind them (R-EVENT-2).
        self.stream_reads = asyncio.Semaphore(max(1, settings.api_pool_size // 2))
        #: The process's one LISTEN connection for the event journal (R-EVENT-2).
        self.events = EventHub(settings.database_url, application_name="qimpl-api-listen",
                               connect_kwargs=keepalive_params(settings.api_lock_timeout_s))
        self._client: Client | None = None
        #: The one connect in flight, shared by every request that needs Temporal meanwhile.
        self._connecting: asyncio.Task[Client] | None = None
        self._provider: Provider | None = None
        #: Per-tenant bound on legacy inline runs executing in this process.
        self._legacy_slots: dict[str, asyncio.Semaphore] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def open(self, timeout_s: float) -> None:
        """Open the pool and wait until a connection works, at most ``timeout_s`` seconds;
        raises ``PoolTimeout``. Each try waits at most 1 s: with RECONNECT_TIMEOUT_S a slot
        that met a refusing server is given up within 2 s, and only a new wait opens
        another (so a database that comes up within ``timeout_s`` is still found)."""
        await self.pool.open(wait=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                conn = await checkout(self.pool, min(1.0, max(deadline - loop.time(), 0.0)),
                                      check=_check_and_forget_tenant)
            except (PoolTimeout, psycopg.Error):
                if loop.time() >= deadline:
                    raise PoolTimeout(f"no database connection within {timeout_s:g} s") from None
                await asyncio.sleep(0.1)  # a check that fails on a live connection is not retried hot
                continue
            await self.pool.putconn(conn)
            return

    async def connect_problem(self) -> ConnectProblem:
        """Why the pool has no connection: one direct connect (at most 2 s) to the pool's
        database, its failure classified (``qimpl.db.connect_errors``); a connect that
        works now counts as ``database_unreachable`` (it did not within the wait)."""
        try:
            conn = await psycopg.AsyncConnection.connect(self.settings.database_url, connect_timeout=2)
        except Exception as exc:  # noqa: BLE001 - classified, never raised
            return connect_problem(exc)
        await conn.close()
        return ConnectProblem("database_unreachable", "no connection came within the wait")

    @property
    def provider(self) -> Provider:
        """The provider for the legacy inline path and ``/v1/answer``."""
        if self._provider is None:
            self._provider = load_provider(self.settings.provider, self.settings.provider_config)
        return self._provider

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background, keeping a reference until it ends."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection (autocommit) whose use inside the block is bounded by
        ``api_db_timeout_s`` (``qimpl.db.sessions.cut_after``): a database that stops
        answering costs a request that long, then 503 ``database_unavailable``."""
        conn = await checkout(self.pool, self.settings.api_pool_timeout_s, check=_check_and_forget_tenant)
        try:
            # As the pool's own connection(): commit, or roll back on an error, then return.
            async with conn, cut_after(conn, self.settings.api_db_timeout_s):
                yield conn
        finally:
            await self.pool.putconn(conn)

    @asynccontextmanager
    async def tenant(self, tenant_id: str) -> AsyncIterator[Any]:
        """A pooled connection inside a transaction scoped to ``tenant_id``: row-level
        security shows and accepts only that tenant's rows (R-AUTH-4). Statements wait at
        most ``api_lock_timeout_s`` for a row lock — a paused owner's is released within the
        lease — then fail with LockNotAvailable, answered 503 ``run_busy``."""
        async with self.connection() as conn, conn.transaction():
            await conn.execute("SELECT set_config('qimpl.tenant', %s, true)", (tenant_id,))
            yield conn

    async def run_legacy(self, run_id: str, tenant_id: str) -> None:
        """Execute a legacy inline run (R-CREATE-6) in this process, bounded (issue 22,
        item 9): at most ``legacy_runs_per_tenant`` at once per tenant (the rest wait,
        ``queued``, holding nothing), each on a connection of its own — never one of the
        API pool's, which the durable routes need — and only until the run's deadline,
        when it ends ``expired``/``deadline_exceeded``."""
        slots = self._legacy_slots.setdefault(
            tenant_id, asyncio.Semaphore(self.settings.legacy_runs_per_tenant))
        async with slots:
            try:
                async with await self._legacy_connection(tenant_id) as conn:
                    cur = await conn.execute(
                        "SELECT extract(epoch FROM deadline_at - clock_timestamp())::float8"
                        " FROM runs WHERE run_id = %s", (run_id,))
                    left = await cur.fetchone()
                    async with asyncio.timeout(max(float(left[0]), 0.0) if left else 0.0):
                        await run_inline(conn, self.provider, run_id)
                return
            except TimeoutError:
                pass
            async with await self._legacy_connection(tenant_id) as conn:
                expired = await repo.expire_if_overdue(conn, run_id)
            if expired is not None:
                log.info("legacy run %s expired at its deadline", run_id,
                         extra={"event": "legacy.expired", "run_id": run_id})

    async def _legacy_connection(self, tenant_id: str) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            self.settings.database_url, autocommit=True, application_name="qimpl-api-legacy",
            **keepalive_params(self.settings.api_lock_timeout_s))
        await conn.execute("SELECT set_config('qimpl.tenant', %s, false)", (tenant_id,))
        return conn

    async def temporal(self) -> Client:
        """The Temporal client, connected on first use (the API starts without Temporal).

        Concurrent callers share one connect attempt, bounded by ``dispatch_timeout_s``
        (seconds): during a Temporal outage each request waits at most one timeout, never
        one per request ahead of it (issue 22, item 8). Raises what the connect raised
        (TimeoutError, RuntimeError, RPCError); the next call tries again."""
        if self._client is not None:
            return self._client
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.create_task(self._connect())
            # Retrieved here too: a failure no request waited for is not "never retrieved".
            self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())
        # Shielded: a request that gives up does not cancel the others' connect.
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> Client:
        client = await asyncio.wait_for(
            Client.connect(self.settings.temporal_address, namespace=self.settings.temporal_namespace,
                           runtime=temporal_runtime()),
            timeout=self.settings.dispatch_timeout_s)
        self._client = client
        return client


def services_of(request: Request) -> Services:
    """The process's services (set in the lifespan); also the ``Svc`` dependency."""
    services: Services = request.app.state.services
    return services


#: ASGI scope key under which ``RequestLimits`` leaves ``(key, principal, monotonic
#: seconds)`` when it found a write's key, so the route does not look the same key up
#: again within the same request (one database round trip and pool checkout less per
#: POST), as long as the answer is at most ``AUTHENTICATED_FOR_S`` old.
AUTHENTICATED = "qimpl.authenticated"
#: How long the guard's answer stands, seconds: a body sent slowly past it is judged by a
#: fresh lookup, so a key revoked meanwhile is refused (R-AUTH-2).
AUTHENTICATED_FOR_S = 1.0


async def principal_of(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
) -> Principal:
    key = bearer_key(request)
    memo = request.scope.get(AUTHENTICATED)
    if key and memo is not None and memo[0] == key and time.monotonic() - memo[2] <= AUTHENTICATED_FOR_S:
        principal: Principal | None = memo[1]
    else:
        principal = await services_of(request).authenticator.authenticate(key) if key else None
    if principal is None:
        raise ApiError(401, "unauthenticated", "a valid API key is required")
    if principal.role == "operator":
        # Operator keys reach the operator surfaces only, never a tenant's client routes.
        raise ApiError(403, "client_credential_required", "this route needs a client key")
    return principal


def bearer_key(request: Request) -> str:
    """The API key of ``Authorization: Bearer <key>`` (the scheme in any case, RFC 7235),
    or of a bare ``Authorization: <key>`` as before; empty when absent."""
    return key_of_header(request.headers.get("authorization") or "")


def key_of_header(value: str) -> str:
    """The API key of an ``Authorization`` header value (see ``bearer_key``)."""
    value = value.strip()
    scheme, _, rest = value.partition(" ")
    return rest.strip() if scheme.lower() == "bearer" and rest.strip() else value


async def operator_principal(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
) -> Principal:
    """An operator key's principal (R-OPS-7): 401 ``unauthenticated`` without a valid key,
    403 ``operator_credential_required`` for a client key."""
    key = bearer_key(request)
    authenticator = services_of(request).authenticator
    principal = await authenticator.authenticate_operator(key) if key else None
    if principal is not None:
        return principal
    if key and await authenticator.authenticate(key) is not None:
        raise ApiError(403, "operator_credential_required", "this route needs an operator key")
    raise ApiError(401, "unauthenticated", "a valid API key is required")


async def owned_run(conn: Any, agent_id: str, run_id: uuid.UUID, principal: Principal) -> dict[str, Any]:
    row = await repo.get_run(conn, str(run_id), tenant_id=principal.tenant_id)
    if row is None or row["principal_id"] != principal.principal_id or row["agent_id"] != agent_id:
        raise ApiError(404, "run_not_found", "no such run")
    return row


#: Route parameters: ``svc: Svc``, ``principal: CurrentPrincipal`` (401 without a valid
#: key), ``principal: OperatorPrincipal`` (R-OPS-7).
Svc = Annotated[Services, Depends(services_of)]
CurrentPrincipal = Annotated[Principal, Depends(principal_of)]
OperatorPrincipal = Annotated[Principal, Depends(operator_principal)]
