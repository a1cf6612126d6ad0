"""The API contract as a matrix, not as examples (R-AUTH-1..3, R-CREATE-2, R-EVENT-2/3,
R-OPS-7): every route of the API under test (its own OpenAPI document, and any route
kept out of it) x every kind of credential, each cell with its one expected answer (the
keyed routes' own matrices are in ``qualify.scenarios.keyed``).

The expected answers are pure (``expected``): a route the table does not know fails the
scenario, so a new route cannot ship without its row. The report shows the whole matrix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from qimpl.lifecycle import TERMINAL
from qualify import http
from qualify.fakes.synthetic import make_prompt
from qualify.procs import wait_until
from qualify.scenarios.base import ScenarioContext, scenario

#: Credential kinds: what each sends as ``Authorization`` (None: no header).
KINDS: dict[str, str | None] = {
    "none": None,
    # The owner's real key in the wrong scheme: a credential the API must not guess at.
    "malformed": "Basic ZGV2LWtleTo=",
    "owner": "Bearer dev-key",
    "peer": "Bearer peer-key",            # another principal of the same tenant
    "other-tenant": "Bearer other-key",
    "operator": "Bearer ops-key",         # an operator of the run's tenant
    "other-operator": "Bearer ops-other-key",
    "revoked": "Bearer revoked-dev-key",  # the owner's principal, a key revoked since
    "expired": "Bearer expired-dev-key",  # the owner's principal, a key rotated away, its grace over
}
#: A revoked key of the owner's principal, created and revoked by the scenario.
REVOKED_KEY = "revoked-dev-key"
#: A key of the owner's principal rotated with a grace period that ended (``api_keys rotate``).
EXPIRED_KEY = "expired-dev-key"
#: The Idempotency-Key every credential kind sends to the create route.
SHARED_CREATE_KEY = "matrix-shared-key"
#: Routes kept out of the OpenAPI document, served all the same (none since /metrics and
#: /healthz are documented; the table still takes any a later change hides).
UNLISTED_ROUTES: tuple[tuple[str, str], ...] = ()
RUN = "/v1/agents/{agent_id}/runs/{run_id}"
#: The listings (R-READ-5): who may see the target run in each, and who must not.
LISTINGS = {
    "/v1/agents/{agent_id}/runs": ({"owner"}, {"peer", "other-tenant"}),
    "/v1/operator/runs": ({"operator"}, {"other-operator"}),
}


@dataclass(frozen=True)
class Answer:
    """The one expected answer of a cell: an HTTP status and the body's ``code`` (None:
    a success, or a body without a code)."""

    status: int
    code: str | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.code}" if self.code else str(self.status)


UNAUTHENTICATED = Answer(401, "unauthenticated")
NOT_FOUND = Answer(404, "run_not_found")
CLIENT_ONLY = Answer(403, "client_credential_required")
OPERATOR_ONLY = Answer(403, "operator_credential_required")

#: The owner's answer on each route of its run, parked ``awaiting_input`` at step 1 with
#: no tool call and no approval (path suffix under ``RUN``).
OWNER_ON_RUN: dict[str, Answer] = {
    "": Answer(200),
    "/events": Answer(200),
    "/cancel": Answer(200),
    "/resume": Answer(202),
    "/tool-approval/{approval_id}": Answer(409, "approval_not_pending"),   # it waits for input
    "/tool-results/{call_id}": Answer(409, "tool_call_not_found"),
    "/stream-token": Answer(200),
    "/pause": Answer(409, "durable_lifecycle_conflict"),
    "/handoff": Answer(409, "durable_lifecycle_conflict"),
    "/checkpoints": Answer(409, "durable_lifecycle_conflict"),
    "/checkpoints/{checkpoint_id}/rollback": Answer(409, "durable_lifecycle_conflict"),
    "/checkpoints/{checkpoint_id}/resume": Answer(409, "durable_lifecycle_conflict"),
    "/checkpoints/{checkpoint_id}/branch": Answer(409, "durable_lifecycle_conflict"),
}
#: Owner cells that change the run: sent last, after the refusals were shown to write nothing.
MUTATING = ("/resume", "/cancel")
#: Request bodies per route (path suffix, or the whole path outside a run).
BODIES: dict[str, Any] = {
    "/resume": {"additional_prompt": "more input"},
    "/tool-approval/{approval_id}": {"approved": True, "action_version": "ab12"},
    "/tool-results/{call_id}": {"result": {}},
    "/stream-token": {"ttl_s": 60},
    "/v1/agents/{agent_id}/runs": {"prompt": make_prompt(steps=1, answer="matrix"), "durable_temporal": True},
    "/v1/answer": {"prompt": make_prompt(steps=1, answer="inline")},
    "/v1/operator/runs/{run_id}/tool-invocations/{call_id}/resolution": {"outcome": "not_executed",
                                                                          "note": "looked it up"},
}


def expected(method: str, path: str, kind: str) -> Answer | None:
    """The one answer ``kind`` must get on ``method path`` (pure); None for a route this
    table does not know (the scenario fails on it).

    Refusals come before anything about the request: no credential, a malformed or a
    revoked or an expired one is 401 on every authenticated route; an operator key on a client route,
    or a client key on an operator route, is 403; a client of another principal or tenant
    gets 404 for the run (no existence leak, R-AUTH-1); the run's events take the run's
    stream key only (an API key is not a stream credential, R-AUTH-3)."""
    if (method, path) in (("GET", "/healthz"), ("GET", "/readyz")):
        return Answer(200)
    client = kind in ("owner", "peer", "other-tenant")
    operator = kind in ("operator", "other-operator")
    if (method, path) == ("GET", RUN + "/events"):
        # X-Stream-Key: the owner sends its run's key, the peer and the other tenant the
        # keys of their own runs, "malformed" a made-up one; the rest have no run to hold one of.
        if kind == "owner":
            return Answer(200)
        if kind in ("peer", "other-tenant", "malformed"):
            return NOT_FOUND
        return Answer(401, "stream_key_required")
    if kind in ("none", "malformed", "revoked", "expired"):
        return UNAUTHENTICATED
    if path.startswith("/v1/operator/") or path == "/metrics":
        if client:
            return OPERATOR_ONLY
        if path in ("/metrics", "/v1/operator/runs"):
            return Answer(200)   # each operator its own tenants' (the listing's check below)
        if kind == "other-operator":
            return NOT_FOUND
        return Answer(200) if method == "GET" else Answer(409, "tool_call_not_found")
    if operator:
        return CLIENT_ONLY
    if (method, path) == ("POST", "/v1/agents/{agent_id}/runs"):
        return Answer(202)   # each client its own run, whatever the others' keys (R-CREATE-2)
    if (method, path) in (("POST", "/v1/answer"), ("GET", "/v1/agents/{agent_id}/runs")):
        return Answer(200)       # a listing: each client its own runs
    if path.startswith(RUN):
        if kind != "owner":
            return NOT_FOUND
        return OWNER_ON_RUN.get(path.removeprefix(RUN))
    return None


def route_table(openapi: dict[str, Any]) -> list[tuple[str, str]]:
    """``(METHOD, path template)`` of every route the API serves: its OpenAPI document's
    operations and the ``UNLISTED_ROUTES`` (pure)."""
    routes = [(m.upper(), p) for p, ops in openapi.get("paths", {}).items() for m in ops
              if m.lower() in ("get", "post", "put", "patch", "delete")]
    return sorted(set(routes) | set(UNLISTED_ROUTES))


def _fill(path: str, run_id: str) -> str:
    return (path.replace("{agent_id}", "agent-1").replace("{run_id}", run_id)
            .replace("{call_id}", "call-none").replace("{checkpoint_id}", "1")
            .replace("{approval_id}", "approval-none"))


def error_code(resp: httpx.Response) -> str | None:
    """The machine-readable ``code`` of an error answer, or None."""
    try:
        doc = resp.json()
    except ValueError:
        return None
    return doc.get("code") if isinstance(doc, dict) else None


def create_with_key(api_url: str, auth: str, key: str, body: dict[str, Any]) -> httpx.Response:
    """POST a create of agent-1 with ``auth`` and the ``Idempotency-Key`` ``key``."""
    return http.post(f"{api_url}/v1/agents/agent-1/runs", json=body, timeout=30,
                      headers={"Authorization": auth, "Idempotency-Key": key})


def runs_not_ended(ctx: ScenarioContext, timeout_s: float = 60.0) -> list[tuple[Any, ...]]:
    """Wait (database clock irrelevant: a deadline on progress) until every run of the
    scenario is terminal; returns the runs still not terminal (none on success)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        open_runs = ctx.sql("SELECT run_id::text, principal_id, state FROM runs WHERE state <> ALL(%s)",
                            [str(s) for s in TERMINAL])
        if not open_runs or time.monotonic() > deadline:
            return open_runs
        time.sleep(0.1)


@scenario(
    "api-contract-matrix",
    title="Every route of the API (its OpenAPI document, /metrics and /healthz included) "
          "x every credential kind (none, malformed, owner, peer principal, other tenant, "
          "operator, other tenant's operator, revoked key, expired key): each cell its one answer; the "
          "refusals wrote nothing; one key across three principals makes three runs",
    requirements=("R-AUTH-1", "R-AUTH-3", "R-CREATE-2", "R-OPS-7", "R-LEGACY-1", "R-READ-5"),
)
def api_contract_matrix(ctx: ScenarioContext) -> None:
    import psycopg

    from qimpl.db import admin

    with psycopg.connect(ctx.deployment.dsn, autocommit=True) as conn:  # as an operator would
        admin.create_api_key(conn, key=REVOKED_KEY, tenant_id="t-dev", principal_id="p-dev")
        revoked = admin.revoke_api_key(conn, key=REVOKED_KEY)
        # A key rotated with a 0.2 s grace: wait on the database's clock until it is past.
        admin.create_api_key(conn, key=EXPIRED_KEY, tenant_id="t-dev", principal_id="p-dev")
        admin.rotate_api_key(conn, key_id=admin.key_id(EXPIRED_KEY), new_key=f"{EXPIRED_KEY}-successor",
                             actor="qualify", grace_s=0.2)
        wait_until(lambda: conn.execute(
            "SELECT expires_at < clock_timestamp() FROM api_keys WHERE key_id = %s",
            (admin.key_id(EXPIRED_KEY),)).fetchone() == (True,), timeout_s=5, what="the rotated key's grace")
    ctx.expect("the revoked key was live, then revoked", revoked == 1, f"{revoked} revoked")
    api = ctx.processes.api()
    ctx.processes.worker()
    url = api.base_url
    # The target: the owner's run parked for input; the peer's and the other tenant's own runs
    # (whose stream keys they hold).
    park = {"prompt": make_prompt(steps=2, park={"step": 1, "kind": "input"}), "durable_temporal": True}
    target = create_with_key(url, str(KINDS["owner"]), "matrix-target", park)
    ctx.history.record("client", op="create", phase="ok", run_id=target.json()["run_id"], status=202)
    run_id = target.json()["run_id"]
    stream_keys = {"owner": target.json()["stream_key"], "malformed": "not-a-stream-key"}
    for kind in ("peer", "other-tenant"):
        own = create_with_key(url, str(KINDS[kind]), f"matrix-own-{kind}", BODIES["/v1/agents/{agent_id}/runs"])
        stream_keys[kind] = own.json()["stream_key"]
    ctx.wait_state(api, run_id, "awaiting_input")
    before = ctx.sql("SELECT row_version, state, (SELECT count(*) FROM run_events e WHERE e.run_id = r.run_id)"
                     " FROM runs r WHERE run_id = %s", run_id)[0]

    routes = route_table(http.get(f"{url}/openapi.json", timeout=10).json())
    unknown = [f"{m} {p}" for m, p in routes if any(expected(m, p, k) is None for k in KINDS)]
    ctx.expect("every route of the API has its row in the matrix", not unknown,
               f"{len(routes)} routes; without expected answers: {unknown}", "R-AUTH-1", judged=len(routes))

    created: dict[str, str] = {}
    listed: dict[tuple[str, str], set[str]] = {}

    def cell(method: str, path: str, kind: str) -> tuple[Answer, str]:
        # Every client creates with one and the same key (keys are scoped per principal,
        # R-CREATE-2: a key scoped wider replays another client's run); elsewhere a key of its own.
        headers = {"Idempotency-Key": SHARED_CREATE_KEY if path == "/v1/agents/{agent_id}/runs"
                   else f"matrix-{kind}"}
        if KINDS[kind] is not None:
            headers["Authorization"] = str(KINDS[kind])
        suffix = path.removeprefix(RUN) if path.startswith(RUN) else path
        body = BODIES.get(suffix)
        if path == RUN + "/events":
            headers.pop("Authorization", None)
            if kind in stream_keys:
                headers["X-Stream-Key"] = stream_keys[kind]
            with http.stream("GET", f"{url}{_fill(path, run_id)}", headers=headers, timeout=15) as resp:
                resp.read() if resp.status_code != 200 else None
                got = Answer(resp.status_code, error_code(resp) if resp.status_code != 200 else None)
        else:
            resp = http.request(method, f"{url}{_fill(path, run_id)}", headers=headers, json=body, timeout=30)
            got = Answer(resp.status_code, error_code(resp) if resp.status_code >= 300 else None)
            if method == "GET" and path in LISTINGS and resp.status_code == 200:
                listed[(path, kind)] = {r["run_id"] for r in resp.json()["runs"]}
            if path == "/v1/agents/{agent_id}/runs" and resp.status_code == 202:
                created[kind] = resp.json()["run_id"]
                ctx.history.record("client", op="create", phase="ok", run_id=created[kind], status=202)
        want = expected(method, path, kind)
        mark = "ok" if got == want else f"FAIL (want {want})"
        return got, f"{got} {mark}"

    results: dict[tuple[str, str], dict[str, str]] = {route: {} for route in routes}
    wrong: dict[tuple[str, str], list[str]] = {route: [] for route in routes}

    def strike(method: str, path: str, kind: str) -> None:
        if expected(method, path, kind) is None:
            results[(method, path)][kind] = "no expected answer"
            return
        got, text = cell(method, path, kind)
        results[(method, path)][kind] = text
        if got != expected(method, path, kind):
            wrong[(method, path)].append(f"{kind}: {text}")

    mutating = {RUN + m for m in MUTATING}
    for method, path in routes:  # every refusal first, and the owner's reads
        for kind in KINDS:
            if not (kind == "owner" and path in mutating):
                strike(method, path, kind)
    after = ctx.sql("SELECT row_version, state, (SELECT count(*) FROM run_events e WHERE e.run_id = r.run_id)"
                    " FROM runs r WHERE run_id = %s", run_id)[0]
    ctx.expect("no refusal and no read changed the run (row_version, state, events)", after == before,
               f"{before} -> {after}", "R-AUTH-1")
    for path in sorted(mutating, key=lambda p: MUTATING.index(p.removeprefix(RUN))):
        strike("POST", path, "owner")
    for (method, path), bad in wrong.items():
        reqs = ("R-AUTH-3",) if path.endswith("/events") else (
            ("R-OPS-7",) if path.startswith("/v1/operator/") or path == "/metrics" else ("R-AUTH-1",))
        ctx.expect(f"{method} {path}: every credential kind gets its one answer", not bad,
                   "; ".join(bad) or f"{len(KINDS)} kinds as expected", *reqs, judged=len(KINDS))
    ctx.table("contract matrix (route x credential kind: the answer got, ok or what was wanted)",
              ["route", *KINDS], [[f"{m} {p}", *(results[(m, p)].get(k, "-") for k in KINDS)]
                                  for m, p in routes])
    for path, (see, blind) in LISTINGS.items():
        shown = {kind: run_id in listed.get((path, kind), set()) for kind in see | blind}
        ctx.expect(f"GET {path} lists the target run to {sorted(see)} and never to {sorted(blind)}",
                   all(shown[k] for k in see) and not any(shown[k] for k in blind)
                   and all((path, k) in listed for k in see | blind),
                   str(shown), "R-READ-5", "R-AUTH-1", judged=sum(p == path for p, _ in listed))
    ctx.expect("one Idempotency-Key from three clients made three runs (keys are per principal)",
               len(set(created.values())) == 3 == len(created), str(created), "R-CREATE-2", judged=len(created))
    left = runs_not_ended(ctx)
    ctx.expect("every run of the matrix ended", not left, str(left))
