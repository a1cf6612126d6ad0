"""The API contract under concurrency: one key across two APIs, racing resumes, legacy
controls, rejected requests that write nothing (R-CREATE-1..2, R-RESUME-1..2, R-LEGACY-1)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from qimpl.lifecycle import workflow_id
from qualify import http
from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import API_KEY, ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted
from qualify.scenarios.receipts import receipt_diff

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@scenario(
    "same-key-twenty-requests",
    title="Twenty concurrent creates with one Idempotency-Key across two API processes: one "
          "run, one workflow, no 5xx; the replays return the original receipt",
    requirements=("R-CREATE-2", "R-CREATE-5"),
)
def same_key_twenty_requests(ctx: ScenarioContext) -> None:
    apis = [ctx.processes.api("api-1"), ctx.processes.api("api-2")]
    ctx.processes.worker()
    body = {"prompt": make_prompt(steps=2, answer="once"), "durable_temporal": True}

    def post(i: int) -> httpx.Response:
        return http.post(f"{apis[i % 2].base_url}/v1/agents/agent-1/runs", json=body, timeout=30,
                          headers={**AUTH, "Idempotency-Key": "the-one-key"})

    # Truly concurrent: each client's connection is open before a start barrier that all
    # twenty cross together, so the requests race in both API processes at once.
    start = threading.Barrier(20)
    spans: list[tuple[float, float]] = []

    def racing_post(i: int) -> httpx.Response:
        with http.client(base_url=apis[i % 2].base_url, timeout=30) as client:
            client.get("/healthz")
            start.wait(timeout=30)
            t0 = time.monotonic()
            resp = client.post("/v1/agents/agent-1/runs", json=body,
                               headers={**AUTH, "Idempotency-Key": "the-one-key"})
            spans.append((t0, time.monotonic()))
            return resp

    ctx.history.record("client", op="create x20", phase="invoke", key="the-one-key")
    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(racing_post, range(20)))
    first_done = min(end for _, end in spans)
    racing = sum(1 for begin, _ in spans if begin < first_done)
    ctx.figures["creates_in_flight_together"] = float(racing)
    ctx.expect("the creates raced: several were sent before the first was answered", racing >= 2,
               f"{racing} of 20 in flight before the first answer", "R-CREATE-2")
    codes = Counter(r.status_code for r in answers)
    ctx.history.record("client", op="create x20", phase="ok", statuses=dict(codes))
    ctx.expect("no 5xx among 20 concurrent requests", not any(c >= 500 for c in codes),
               str(dict(codes)), "R-CREATE-2")
    originals = sum(1 for r in answers if r.status_code == 202 and r.headers.get("idempotent-replayed") != "true")
    ctx.expect("exactly one original 202 (no Idempotent-Replayed); the other 202s are replays",
               originals == 1, f"{originals} originals among {codes[202]} 202s", "R-CREATE-2", judged=20)
    run_ids = {r.json()["run_id"] for r in answers if r.status_code == 202}
    ctx.expect("every 202 names the same run", len(run_ids) == 1, str(run_ids), "R-CREATE-2")
    others = {r.json().get("code") for r in answers if r.status_code != 202}
    ctx.expect("the others are 409 idempotency_key_in_flight", others <= {"idempotency_key_in_flight"},
               str(others), "R-CREATE-2")
    runs = ctx.sql("SELECT count(*) FROM runs")[0][0]
    ctx.expect("exactly one run committed", runs == 1, f"{runs} runs", "R-CREATE-2")
    (run_id,) = run_ids
    ctx.wait_terminal(apis[0], run_id)
    original: dict[str, Any] = next((r.json() for r in answers
                     if r.status_code == 202 and r.headers.get("idempotent-replayed") != "true"), {})
    replays = [r.json() for r in answers if r.status_code == 202 and r.headers.get("idempotent-replayed") == "true"]
    replay = post(0)
    differ = [receipt_diff(original, r) for r in [*replays, replay.json() if replay.status_code == 202 else {}]]
    ctx.expect("every replay, racing or later, returns the original receipt whole (stream key, deadline, ...) "
               "with Idempotent-Replayed",
               replay.status_code == 202 and replay.headers.get("idempotent-replayed") == "true"
               and not any(differ), f"{replay.text[:160]}; differences {[d for d in differ if d][:2]}",
               "R-CREATE-2", judged=len(differ))
    other = http.post(f"{apis[1].base_url}/v1/agents/agent-1/runs", timeout=10,
                       json={**body, "prompt": "another body"}, headers={**AUTH, "Idempotency-Key": "the-one-key"})
    ctx.expect("the same key with another body is 422 idempotency_key_reused",
               other.status_code == 422 and other.json().get("code") == "idempotency_key_reused",
               other.text[:200], "R-CREATE-2")
    ctx.expect("one workflow", ctx.workflow_result(workflow_id(run_id, 1)).get("state") == "completed",
               "g1 completed", "R-CREATE-5")


@scenario(
    "concurrent-resumes",
    title="Ten concurrent resumes of one awaiting_input run: one 202, nine 409, one new "
          "generation and workflow, deadline unchanged; the winner's key replays its receipt",
    requirements=("R-RESUME-1", "R-RESUME-2", "R-READ-2"),
)
def concurrent_resumes(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    # The resumed generation holds at step 2 until every resume is answered: the losers
    # meet a live run (a generation of two instant steps had completed before the last of
    # them under load, and run_terminal was then the right answer to it).
    run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="resumed", park={"step": 1, "kind": "input"},
                                                   barrier={"step": 2, "name": "resumed"}))
    parked = ctx.wait_state(api, run_id, "awaiting_input")
    ctx.expect("pending_input has a kind", (parked["result_json"] or {}).get("pending_input", {}).get("kind")
               == "input", str(parked["result_json"]), "R-READ-2")

    def resume(i: int) -> httpx.Response:
        return http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", timeout=30,
                          json={"additional_prompt": f"input {i}"},
                          headers={**AUTH, "Idempotency-Key": f"resume-{i}"})

    try:
        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(pool.map(resume, range(10)))
    finally:
        ctx.release_barrier("resumed")
    codes = Counter(r.status_code for r in answers)
    ctx.history.record("client", op="resume x10", phase="ok", statuses=dict(codes))
    ctx.expect("exactly one 202 and nine 409", codes == Counter({202: 1, 409: 9}), str(dict(codes)),
               "R-RESUME-1")
    # The losers lost to a live resume, not to an ended run: each is told so (it lost the
    # compare-and-set or read the new generation still accepted: run_resume_conflict; or
    # read the run already running: run_active). Never run_not_resumable, whose advice
    # (an accepted run takes no input, resume with an empty body) is for a run no resume
    # won (a tester's finding: five losers were told to drop their input).
    lost = Counter(r.json().get("code") for r in answers if r.status_code == 409)
    ctx.expect("the nine 409s say another resume won or the run is live (run_resume_conflict or "
               "run_active), never ended",
               sum(lost.values()) == 9 and set(lost) <= {"run_resume_conflict", "run_active"},
               str(dict(lost)), "R-RESUME-1", "R-RESUME-2", judged=9)
    wins = [i for i, r in enumerate(answers) if r.status_code == 202]
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("one new generation, completed", run["generation"] == 2 and run["state"] == "completed",
               f"g{run['generation']} {run['state']}", "R-RESUME-1")
    ctx.expect("deadline_at unchanged by the resume", run["deadline_at"] == parked["deadline_at"],
               f"{parked['deadline_at']} -> {run['deadline_at']}", "R-RESUME-1")
    if wins:
        again = resume(wins[0])
        first = answers[wins[0]].json()
        ctx.expect("replaying the winner's key returns the same receipt, whole",
                   again.status_code == 202 and not receipt_diff(first, again.json())
                   and again.headers.get("idempotent-replayed") == "true",
                   f"{again.text[:160]}; differs {receipt_diff(first, again.json()) if again.status_code == 202 else ''}",
                   "R-RESUME-1")
    terminal = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", timeout=10,
                          json={"additional_prompt": "more"}, headers={**AUTH, "Idempotency-Key": "late"})
    ctx.expect("a terminal run answers 409 run_terminal",
               terminal.status_code == 409 and terminal.json().get("code") == "run_terminal",
               terminal.text[:200], "R-RESUME-2")
    ctx.expect("one workflow per generation", ctx.workflow_result(workflow_id(run_id, 2)).get("state")
               == "completed", "g2 completed", "R-RESUME-1")


@scenario(
    "contract-probes",
    title="Rejected requests write nothing and carry a code; legacy controls answer 409 "
          "durable_lifecycle_conflict for durable runs; cancel answers true/false as specified",
    requirements=("R-CREATE-1", "R-CREATE-2", "R-LEGACY-1", "R-CANCEL-1", "R-AUTH-1", "R-RESUME-2"),
)
def contract_probes(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    ctx.processes.worker()
    url = f"{api.base_url}/v1/agents/agent-1/runs"
    bad = {
        "prompt_empty": {"prompt": "", "durable_temporal": True},
        "deadline_out_of_range": {"prompt": "x", "durable_temporal": True, "deadline_seconds": 0},
        "mode_unsupported": {"prompt": "x", "durable_temporal": True, "mode": "chat"},
        "unknown_field": {"prompt": "x", "durable_temporal": True, "extra": 1},
    }
    for code, body in bad.items():
        resp = http.post(url, json=body, headers={**AUTH, "Idempotency-Key": f"bad-{code}"}, timeout=10)
        ctx.expect(f"422 {code}", resp.status_code == 422 and resp.json().get("code") == code,
                   resp.text[:160], "R-CREATE-1")
    garbage = http.post(url, content=b"{not json", timeout=10,
                         headers={**AUTH, "Idempotency-Key": "bad-json", "Content-Type": "application/json"})
    ctx.expect("422 malformed_body", garbage.status_code == 422 and garbage.json().get("code") == "malformed_body",
               garbage.text[:160], "R-CREATE-1")
    nokey = http.post(url, json={"prompt": "x", "durable_temporal": True}, headers=AUTH, timeout=10)
    ctx.expect("400 idempotency_key_required", nokey.status_code == 400
               and nokey.json().get("code") == "idempotency_key_required", nokey.text[:160], "R-CREATE-2")
    written = ctx.sql("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM idempotency_records)")[0]
    ctx.expect("rejected requests wrote nothing", written == (0, 0), str(written), "R-CREATE-1")
    run_id = accepted(ctx, api, prompt=make_prompt(steps=2, answer="done"))
    for path in ("pause", "handoff", "checkpoints", "checkpoints/1/rollback", "checkpoints/1/branch",
                 "checkpoints/1/resume"):
        resp = http.post(f"{url}/{run_id}/{path}", headers=AUTH, timeout=10)
        ctx.expect(f"legacy {path}: 409 durable_lifecycle_conflict", resp.status_code == 409
                   and resp.json().get("code") == "durable_lifecycle_conflict", resp.text[:160], "R-LEGACY-1")
    ctx.wait_terminal(api, run_id)
    late = ctx.cancel_run(api, run_id)
    ctx.expect("cancel of a completed run: cancelled false", late["cancelled"] is False, str(late), "R-CANCEL-1")
    other = http.get(f"{url}/{run_id}", headers={"Authorization": "Bearer nobody"}, timeout=10)
    ctx.expect("an unknown key is 401 unauthenticated", other.status_code == 401
               and other.json().get("code") == "unauthenticated", other.text[:160], "R-AUTH-1")
    missing = http.get(f"{url}/00000000-0000-0000-0000-000000000000", headers=AUTH, timeout=10)
    ctx.expect("an unknown run is 404 run_not_found", missing.status_code == 404
               and missing.json().get("code") == "run_not_found", missing.text[:160], "R-AUTH-1")
    busy = accepted(ctx, api, prompt=make_prompt(steps=50, delay_ms=100))
    ctx.wait_state(api, busy, "running")
    active = http.post(f"{url}/{busy}/resume", json={"additional_prompt": "x"}, timeout=10,
                        headers={**AUTH, "Idempotency-Key": "busy"})
    ctx.expect("resume of a running run is 409 run_active",
               active.status_code == 409 and active.json().get("code") == "run_active",
               active.text[:160], "R-RESUME-2")
    twice = [ctx.cancel_run(api, busy)]
    again = ctx.cancel_run(api, ctx.sql("SELECT run_id::text FROM runs WHERE state = 'cancelled'")[0][0])
    ctx.expect("cancel twice: true both times", twice[0]["cancelled"] is True and again["cancelled"] is True,
               f"{twice[0]} {again}", "R-CANCEL-1")


def canary_for(seed: int) -> str:
    """The authorisation grant planted by ``tenant-isolation``: recognisable, derived from the
    seed so that a test can scan a report for it without the report containing it."""
    return f"CANARY-GRANT-{seed:x}-do-not-leak"


@scenario(
    "tenant-isolation",
    title="Another tenant or principal gets 404 on every run route; a workspace without a grant "
          "is 403; a revoked grant blocks resume (403) until restored; a planted grant never "
          "appears in any response or log",
    requirements=("R-AUTH-1", "R-AUTH-2", "R-READ-3", "R-AUTH-4"),
)
def tenant_isolation(ctx: ScenarioContext) -> None:
    import psycopg

    from qimpl.db import admin

    seed = int(ctx.history.events[0].get("seed", 0)) if ctx.history.events else 0
    canary = canary_for(seed)
    with psycopg.connect(ctx.deployment.dsn, autocommit=True) as conn:  # as an operator
        admin.grant_workspace(conn, tenant_id="t-dev", principal_id="p-dev", workspace_id="default",
                              grant_token=canary)
    api = ctx.processes.api()
    worker = ctx.processes.worker()
    bodies: list[str] = []

    def call(method: str, path: str, key: str, **kw: object) -> httpx.Response:
        resp = http.request(method, f"{api.base_url}{path}", timeout=15,
                             headers={"Authorization": f"Bearer {key}", "Idempotency-Key": f"k-{len(bodies)}"},
                             **kw)  # type: ignore[arg-type]
        bodies.append(resp.text + " " + " ".join(f"{k}:{v}" for k, v in resp.headers.items()))
        return resp

    created = call("POST", "/v1/agents/agent-1/runs", "dev-key",
                   json={"prompt": make_prompt(steps=2, park={"step": 1, "kind": "input"}),
                         "durable_temporal": True})
    run_id = created.json()["run_id"]
    ctx.history.record("client", op="create", phase="ok", run_id=run_id)
    ctx.wait_state(api, run_id, "awaiting_input")
    base = f"/v1/agents/agent-1/runs/{run_id}"
    routes: list[tuple[str, str, dict[str, Any]]] = [("GET", base, {}), ("POST", f"{base}/cancel", {}),
              ("POST", f"{base}/resume", {"json": {"additional_prompt": "x"}}),
              ("POST", f"{base}/pause", {}), ("POST", f"{base}/checkpoints/1/rollback", {}),
              ("POST", f"{base}/tool-approval/ap-1", {"json": {"approved": True, "action_version": "ab12"}}),
              ("POST", f"{base}/tool-results/tc-00000000-0000-0000-0000-000000000000", {"json": {"result": {}}}),
              ("POST", f"{base}/stream-token", {"json": {"ttl_s": 60}})]
    # The answer for a run that does not exist: another principal's or tenant's run must be
    # answered exactly so, saying nothing of whose it is or what state it is in.
    nowhere = "/v1/agents/agent-1/runs/00000000-0000-4000-8000-000000000000"
    for key in ("other-key", "peer-key"):
        for method, path, kw in routes:
            resp = call(method, path, key, **kw)
            absent = call(method, nowhere + path.removeprefix(base), key, **kw)
            ctx.expect(f"{key}: {method} {path.removeprefix(base) or '/'} is 404 run_not_found, as for no run",
                       resp.status_code == 404 and resp.json().get("code") == "run_not_found"
                       and resp.json() == absent.json(),
                       f"{resp.status_code} {resp.text[:100]}; for no run: {absent.text[:100]}", "R-AUTH-1")
    denied = call("POST", "/v1/agents/agent-1/runs", "dev-key",
                  json={"prompt": "x", "durable_temporal": True, "workspace_id": "secret"})
    ctx.expect("a workspace without a grant is 403 workspace_access_denied",
               denied.status_code == 403 and denied.json().get("code") == "workspace_access_denied",
               denied.text[:120], "R-AUTH-2")
    with psycopg.connect(ctx.deployment.dsn, autocommit=True) as conn:
        admin.revoke_workspace(conn, tenant_id="t-dev", principal_id="p-dev", workspace_id="default")
    revoked = call("POST", f"{base}/resume", "dev-key", json={"additional_prompt": "go on"})
    ctx.expect("resume after the grant was revoked is 403 workspace_access_revoked",
               revoked.status_code == 403 and revoked.json().get("code") == "workspace_access_revoked",
               revoked.text[:120], "R-AUTH-2")
    with psycopg.connect(ctx.deployment.dsn, autocommit=True) as conn:
        admin.grant_workspace(conn, tenant_id="t-dev", principal_id="p-dev", workspace_id="default",
                              grant_token=canary)
    resumed = call("POST", f"{base}/resume", "dev-key", json={"additional_prompt": "go on"})
    ctx.expect("with the grant restored the resume is accepted", resumed.status_code == 202,
               resumed.text[:120], "R-AUTH-2")
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("run completed", run["state"] == "completed", run["state"])
    bodies.append(str(run))
    with http.stream("GET", f"{api.base_url}{base}/events", timeout=30,
                      headers={"X-Stream-Key": created.json()["stream_key"]}) as events:
        bodies.append("".join(events.iter_text()))
    worker.stop()
    api.stop()
    leaks = [b[:80] for b in bodies if canary in b]
    leaks += [p.name for p in (ctx.deployment.logs_dir.glob("*.log")) if canary in p.read_text(errors="replace")]
    ctx.expect("the planted grant appears in no response, event and no process log", not leaks,
               f"{len(bodies)} responses (with the event stream) and every log scanned; leaks: {leaks}",
               "R-READ-3")
