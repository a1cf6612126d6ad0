"""The API contract as a matrix, not as examples (R-AUTH-1..3, R-CREATE-2, R-EVENT-2/3,
R-OPS-7): every route of the API under test (its own OpenAPI document, and any route
kept out of it) x every kind of credential, each cell with its one expected answer; every
field of each keyed body changed under the same key; twenty identical concurrent resumes;
a finished stream reconnected with every ``Last-Event-ID`` it could carry.

The expected answers are pure (``expected``): a route the table does not know fails the
scenario, so a new route cannot ship without its row. The report shows the whole matrix."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from qimpl.lifecycle import TERMINAL
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
    if (method, path) == ("GET", "/healthz"):
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


def _code(resp: httpx.Response) -> str | None:
    try:
        doc = resp.json()
    except ValueError:
        return None
    return doc.get("code") if isinstance(doc, dict) else None


def _create(api_url: str, auth: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api_url}/v1/agents/agent-1/runs", json=body, timeout=30,
                      headers={"Authorization": auth, "Idempotency-Key": key})


def _terminal_everywhere(ctx: ScenarioContext, timeout_s: float = 60.0) -> list[tuple[Any, ...]]:
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
    target = _create(url, str(KINDS["owner"]), "matrix-target", park)
    ctx.history.record("client", op="create", phase="ok", run_id=target.json()["run_id"], status=202)
    run_id = target.json()["run_id"]
    stream_keys = {"owner": target.json()["stream_key"], "malformed": "not-a-stream-key"}
    for kind in ("peer", "other-tenant"):
        own = _create(url, str(KINDS[kind]), f"matrix-own-{kind}", BODIES["/v1/agents/{agent_id}/runs"])
        stream_keys[kind] = own.json()["stream_key"]
    ctx.wait_state(api, run_id, "awaiting_input")
    before = ctx.sql("SELECT row_version, state, (SELECT count(*) FROM run_events e WHERE e.run_id = r.run_id)"
                     " FROM runs r WHERE run_id = %s", run_id)[0]

    routes = route_table(httpx.get(f"{url}/openapi.json", timeout=10).json())
    unknown = [f"{m} {p}" for m, p in routes if any(expected(m, p, k) is None for k in KINDS)]
    ctx.expect("every route of the API has its row in the matrix", not unknown,
               f"{len(routes)} routes; without expected answers: {unknown}", "R-AUTH-1", judged=len(routes))

    created: dict[str, str] = {}
    listed: dict[tuple[str, str], set[str]] = {}

    def cell(method: str, path: str, kind: str) -> tuple[Answer, str]:
        headers = {"Idempotency-Key": f"matrix-{kind}"}
        if KINDS[kind] is not None:
            headers["Authorization"] = str(KINDS[kind])
        suffix = path.removeprefix(RUN) if path.startswith(RUN) else path
        body = BODIES.get(suffix)
        if path == RUN + "/events":
            headers.pop("Authorization", None)
            if kind in stream_keys:
                headers["X-Stream-Key"] = stream_keys[kind]
            with httpx.stream("GET", f"{url}{_fill(path, run_id)}", headers=headers, timeout=15) as resp:
                resp.read() if resp.status_code != 200 else None
                got = Answer(resp.status_code, _code(resp) if resp.status_code != 200 else None)
        else:
            resp = httpx.request(method, f"{url}{_fill(path, run_id)}", headers=headers, json=body, timeout=30)
            got = Answer(resp.status_code, _code(resp) if resp.status_code >= 300 else None)
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
    left = _terminal_everywhere(ctx)
    ctx.expect("every run of the matrix ended", not left, str(left))


@dataclass(frozen=True)
class FieldChange:
    """A keyed request and the same request with one field changed (pure)."""

    field: str
    change: Callable[[dict[str, Any]], dict[str, Any]]


#: For every field of the create body, a change that keeps the request otherwise valid
#: where the field allows one (R-CREATE-1): the replay must be 422 ``idempotency_key_reused``.
CREATE_CHANGES = (
    FieldChange("prompt", lambda b: {**b, "prompt": b["prompt"] + " "}),
    FieldChange("deadline_seconds", lambda b: {**b, "deadline_seconds": b["deadline_seconds"] + 1}),
    FieldChange("workspace_id", lambda b: {**b, "workspace_id": "other"}),
    FieldChange("durable_temporal", lambda b: {**b, "durable_temporal": False}),
    FieldChange("mode", lambda b: {k: v for k, v in b.items() if k != "mode"}),   # the default: unchanged
    FieldChange("response_mode", lambda b: {k: v for k, v in b.items() if k != "response_mode"}),
)


@scenario(
    "idempotency-per-field",
    title="Same Idempotency-Key, each field of the create body changed in turn (and the agent "
          "in the path): 422 idempotency_key_reused, nothing written; a field left at its "
          "default replays; the key from the peer principal is its own run; twenty identical "
          "concurrent resumes: one original 202, the rest replays or 409 in flight, one generation",
    requirements=("R-CREATE-2", "R-CREATE-1", "R-RESUME-1"),
)
def idempotency_per_field(ctx: ScenarioContext) -> None:
    from qimpl.api.models import CreateRunRequest

    api = ctx.processes.api()
    ctx.processes.worker()
    url = api.base_url
    owner = str(KINDS["owner"])
    body = {"prompt": make_prompt(steps=2, park={"step": 1, "kind": "input"}), "durable_temporal": True,
            "mode": "ask", "response_mode": "receipt", "deadline_seconds": 600, "workspace_id": "default"}
    covered = {c.field for c in CREATE_CHANGES}
    ctx.expect("every field of the create body is changed once", covered == set(CreateRunRequest.model_fields),
               f"changed {sorted(covered)}; the model has {sorted(CreateRunRequest.model_fields)}", "R-CREATE-2")
    first = _create(url, owner, "the-key", body)
    ctx.expect("the first create is 202", first.status_code == 202, first.text[:160], "R-CREATE-2")
    run_id = first.json()["run_id"]
    ctx.history.record("client", op="create", phase="ok", run_id=run_id, status=202)
    ctx.wait_state(api, run_id, "awaiting_input")
    counted = ctx.sql("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM idempotency_records)")[0]
    for change in CREATE_CHANGES:
        resp = _create(url, owner, "the-key", change.change(body))
        if change.field in ("mode", "response_mode"):
            ok = resp.status_code == 202 and resp.json()["run_id"] == run_id \
                and resp.headers.get("idempotent-replayed") == "true"
            ctx.expect(f"{change.field} left to its default (the only value it takes): a replay", ok,
                       f"{resp.status_code} {resp.text[:160]}", "R-CREATE-2")
            continue
        ctx.expect(f"same key, {change.field} changed: 422 idempotency_key_reused",
                   resp.status_code == 422 and _code(resp) == "idempotency_key_reused",
                   f"{resp.status_code} {resp.text[:160]}", "R-CREATE-2")
    other_agent = httpx.post(f"{url}/v1/agents/agent-2/runs", json=body, timeout=30,
                             headers={"Authorization": owner, "Idempotency-Key": "the-key"})
    ctx.expect("same key, the agent in the path changed: 422 idempotency_key_reused",
               other_agent.status_code == 422 and _code(other_agent) == "idempotency_key_reused",
               f"{other_agent.status_code} {other_agent.text[:160]}", "R-CREATE-2")
    now = ctx.sql("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM idempotency_records)")[0]
    ctx.expect("the refused replays wrote nothing", now == counted, f"{counted} -> {now}", "R-CREATE-1")
    peer = _create(url, str(KINDS["peer"]), "the-key", body)
    ctx.expect("the same key from another principal of the tenant is its own run",
               peer.status_code == 202 and peer.json()["run_id"] != run_id
               and peer.headers.get("idempotent-replayed") is None, f"{peer.status_code} {peer.text[:160]}",
               "R-CREATE-2")
    if peer.status_code == 202:
        ctx.history.record("client", op="create", phase="ok", run_id=peer.json()["run_id"], status=202)
        httpx.post(f"{url}/v1/agents/agent-1/runs/{peer.json()['run_id']}/cancel", timeout=30,
                   headers={"Authorization": str(KINDS["peer"])})

    # Twenty identical resumes with one key, released together.
    start = threading.Barrier(20)

    def resume(_: int) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=30) as client:
            client.get("/healthz")
            start.wait(timeout=30)
            return client.post(f"/v1/agents/agent-1/runs/{run_id}/resume", json={"additional_prompt": "go"},
                               headers={"Authorization": owner, "Idempotency-Key": "resume-once"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(resume, range(20)))
    kinds = Counter("original" if r.status_code == 202 and r.headers.get("idempotent-replayed") != "true"
                    else "replay" if r.status_code == 202 else f"{r.status_code} {_code(r)}" for r in answers)
    ctx.history.record("client", op="resume x20", phase="ok", answers=dict(kinds))
    ctx.expect("twenty identical resumes: exactly one original 202",
               kinds["original"] == 1, str(dict(kinds)), "R-CREATE-2", "R-RESUME-1", judged=20)
    allowed = {"original", "replay", "409 idempotency_key_in_flight"}
    ctx.expect("the other nineteen are replays of its receipt or 409 idempotency_key_in_flight",
               set(kinds) <= allowed, str(dict(kinds)), "R-CREATE-2", judged=20)
    receipts = {json.dumps({k: r.json().get(k) for k in ("run_id", "deadline_at")})
                for r in answers if r.status_code == 202}
    ctx.expect("every 202 carries the one receipt", len(receipts) == 1, str(receipts), "R-RESUME-1")
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("one new generation", run["generation"] == 2, f"g{run['generation']} {run['state']}", "R-RESUME-1")
    left = _terminal_everywhere(ctx)
    ctx.expect("every run ended", not left, str(left))


RESUME_CAS = "api.resume.before_cas"


@scenario(
    "same-key-resume-loses-the-race",
    title="Two resumes with one Idempotency-Key: the first is held after its key lookup, before "
          "its compare-and-set; the second wins; the first, released, loses the compare-and-set "
          "and answers as its key does (a replay of the winner's receipt), never as a rival resume",
    requirements=("R-CREATE-2", "R-RESUME-1", "R-Q-4"),
    crash_points=(RESUME_CAS,),
)
def same_key_resume_loses_the_race(ctx: ScenarioContext) -> None:
    # The hold is not a nemesis fault (the API lives on); its evidence is a struck crash point.
    api = ctx.processes.api(QIMPL_CRASH_POINTS=f"{RESUME_CAS}:hold")
    ctx.processes.worker()
    owner = str(KINDS["owner"])
    parked = _create(api.base_url, owner, "race-run",
                     {"prompt": make_prompt(steps=2, park={"step": 1, "kind": "input"}), "durable_temporal": True})
    run_id = parked.json()["run_id"]
    ctx.history.record("client", op="create", phase="ok", run_id=run_id, status=202)
    ctx.wait_state(api, run_id, "awaiting_input")

    def resume() -> httpx.Response:
        return httpx.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", timeout=60,
                          json={"additional_prompt": "go"},
                          headers={"Authorization": owner, "Idempotency-Key": "raced-key"})

    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(resume)
        evidence = ctx.wait_crash_point(RESUME_CAS, api)
        second = resume()   # the first is held: this one looks the key up, finds nothing, and wins
        ctx.release_crash_point(RESUME_CAS)
        lost = first.result(timeout=60)
    ctx.expect("the first request was held at the compare-and-set, for this run",
               evidence.get("action") == "hold" and evidence.get("context", {}).get("run_id") == run_id,
               json.dumps(evidence)[:200], "R-Q-4")
    ctx.expect("the second request won: 202, an original receipt",
               second.status_code == 202 and second.headers.get("idempotent-replayed") != "true",
               f"{second.status_code} {second.text[:160]}", "R-RESUME-1")
    ctx.expect("the held request, which lost the compare-and-set, answers as its key: a replay of that receipt",
               lost.status_code == 202 and lost.headers.get("idempotent-replayed") == "true"
               and second.status_code == 202 and lost.json().get("run_id") == second.json().get("run_id"),
               f"{lost.status_code} {lost.text[:160]}", "R-CREATE-2")
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("one new generation", run["generation"] == 2, f"g{run['generation']} {run['state']}", "R-RESUME-1")


@scenario(
    "stream-every-last-event-id",
    title="A finished run's stream reconnected with every Last-Event-ID from 0 to its terminal "
          "event, alternating two API instances: each time every later event exactly once, in "
          "journal order, ending with the terminal event; terminal - 1 gives only the terminal "
          "event; the terminal id gives 204",
    requirements=("R-EVENT-2", "R-EVENT-3"),
)
def stream_every_last_event_id(ctx: ScenarioContext) -> None:
    from qualify.scenarios.streams import read_stream

    apis = [ctx.processes.api("api-1"), ctx.processes.api("api-2")]
    ctx.processes.worker()
    resp = ctx.create_run(apis[0], prompt=make_prompt(steps=3, answer="every id", deltas=2))
    assert resp is not None
    run_id, key = resp.json()["run_id"], resp.json()["stream_key"]
    run = ctx.wait_terminal(apis[0], run_id)
    journal = [str(i) for (i,) in ctx.sql("SELECT seq FROM run_events WHERE run_id = %s ORDER BY seq", run_id)]
    whole = read_stream(ctx, apis[0], run_id, key, client="whole")
    ids = [e.get("id") for e in whole]
    ctx.expect("the whole stream is the run's journal, in order, ending with its terminal event",
               ids == journal and bool(whole) and whole[-1].get("event") == "terminal",
               f"{len(ids)} events, journal {len(journal)}; last {whole[-1].get('event') if whole else None}",
               "R-EVENT-2", "R-EVENT-3", judged=len(journal))
    terminal = int(journal[-1]) if journal else 0
    wrong: list[str] = []
    for n, last in enumerate(range(0, terminal + 1)):
        got = read_stream(ctx, apis[n % 2], run_id, key, last_event_id=str(last), client=f"after-{last}")
        want = [i for i in journal if int(i) > last]
        if last == terminal:
            if got != [{"status": 204, "body": ""}]:
                wrong.append(f"after {last} (terminal): {str(got)[:80]}")
            continue
        if [e.get("id") for e in got] != want or got[-1].get("event") != "terminal":
            wrong.append(f"after {last}: got {[e.get('id') or e.get('status') for e in got]}, want {want}")
    ctx.expect("every Last-Event-ID from 0 to the terminal id: every later event exactly once, in order, "
               "then the terminal event (204 after it)", not wrong, "; ".join(wrong[:5]) or
               f"{terminal + 1} reconnections (0..{terminal}) on {len(apis)} API instances", "R-EVENT-2", "R-EVENT-3",
               judged=terminal + 1)
    before_last = read_stream(ctx, apis[1], run_id, key, last_event_id=str(terminal - 1), client="penultimate")
    ctx.expect("terminal - 1: only the terminal event, matching the run record",
               len(before_last) == 1 and before_last[0].get("event") == "terminal"
               and json.loads(before_last[0]["data"]).get("state") == run["state"],
               str(before_last)[:160], "R-EVENT-3")
