"""The keyed routes beyond their happy path (R-CREATE-1..2, R-RESUME-2, R-EVENT-2/3): every
field of a keyed create body changed under the same key, twenty identical concurrent
resumes of which one wins, and a finished stream reconnected with every Last-Event-ID
it could carry."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from qualify import http
from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.matrix import KINDS, create_with_key, error_code, runs_not_ended
from qualify.scenarios.receipts import RECEIPT_FIELDS, receipt_diff


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
    # Recorded with its key and deadline: the generic deadline check judges this run too.
    ctx.history.record("client", op="create", phase="invoke", key="the-key",
                       deadline_seconds=body["deadline_seconds"])
    first = create_with_key(url, owner, "the-key", body)
    ctx.expect("the first create is 202", first.status_code == 202, first.text[:160], "R-CREATE-2")
    run_id = first.json()["run_id"]
    ctx.history.record("client", op="create", phase="ok", run_id=run_id, status=202, key="the-key")
    ctx.wait_state(api, run_id, "awaiting_input")
    counted = ctx.sql("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM idempotency_records)")[0]
    for change in CREATE_CHANGES:
        resp = create_with_key(url, owner, "the-key", change.change(body))
        if change.field in ("mode", "response_mode"):
            ok = resp.status_code == 202 and resp.json()["run_id"] == run_id \
                and resp.headers.get("idempotent-replayed") == "true"
            ctx.expect(f"{change.field} left to its default (the only value it takes): a replay", ok,
                       f"{resp.status_code} {resp.text[:160]}", "R-CREATE-2")
            continue
        ctx.expect(f"same key, {change.field} changed: 422 idempotency_key_reused",
                   resp.status_code == 422 and error_code(resp) == "idempotency_key_reused",
                   f"{resp.status_code} {resp.text[:160]}", "R-CREATE-2")
    other_agent = http.post(f"{url}/v1/agents/agent-2/runs", json=body, timeout=30,
                             headers={"Authorization": owner, "Idempotency-Key": "the-key"})
    ctx.expect("same key, the agent in the path changed: 422 idempotency_key_reused",
               other_agent.status_code == 422 and error_code(other_agent) == "idempotency_key_reused",
               f"{other_agent.status_code} {other_agent.text[:160]}", "R-CREATE-2")
    now = ctx.sql("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM idempotency_records)")[0]
    ctx.expect("the refused replays wrote nothing", now == counted, f"{counted} -> {now}", "R-CREATE-1")
    peer = create_with_key(url, str(KINDS["peer"]), "the-key", body)
    ctx.expect("the same key from another principal of the tenant is its own run",
               peer.status_code == 202 and peer.json()["run_id"] != run_id
               and peer.headers.get("idempotent-replayed") is None, f"{peer.status_code} {peer.text[:160]}",
               "R-CREATE-2")
    if peer.status_code == 202:
        ctx.history.record("client", op="create", phase="ok", run_id=peer.json()["run_id"], status=202)
        http.post(f"{url}/v1/agents/agent-1/runs/{peer.json()['run_id']}/cancel", timeout=30,
                   headers={"Authorization": str(KINDS["peer"])})

    # Twenty identical resumes with one key, released together.
    start = threading.Barrier(20)

    def resume(_: int) -> httpx.Response:
        with http.client(base_url=url, timeout=30) as client:
            client.get("/healthz")
            start.wait(timeout=30)
            return client.post(f"/v1/agents/agent-1/runs/{run_id}/resume", json={"additional_prompt": "go"},
                               headers={"Authorization": owner, "Idempotency-Key": "resume-once"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(resume, range(20)))
    kinds = Counter("original" if r.status_code == 202 and r.headers.get("idempotent-replayed") != "true"
                    else "replay" if r.status_code == 202 else f"{r.status_code} {error_code(r)}" for r in answers)
    ctx.history.record("client", op="resume x20", phase="ok", answers=dict(kinds))
    ctx.expect("twenty identical resumes: exactly one original 202",
               kinds["original"] == 1, str(dict(kinds)), "R-CREATE-2", "R-RESUME-1", judged=20)
    allowed = {"original", "replay", "409 idempotency_key_in_flight"}
    ctx.expect("the other nineteen are replays of its receipt or 409 idempotency_key_in_flight",
               set(kinds) <= allowed, str(dict(kinds)), "R-CREATE-2", judged=20)
    receipts = {json.dumps({k: r.json().get(k) for k in RECEIPT_FIELDS}, sort_keys=True)
                for r in answers if r.status_code == 202}
    ctx.expect("every 202 carries the one receipt", len(receipts) == 1, str(receipts), "R-RESUME-1")
    # The same resume key with another body: refused like a create's, whatever the run's
    # state now, and nothing written (the fingerprint covers the resume's body).
    before = ctx.sql("SELECT row_version, generation FROM runs WHERE run_id = %s", run_id)[0]
    reused = http.post(f"{url}/v1/agents/agent-1/runs/{run_id}/resume", json={"additional_prompt": "other"},
                       headers={"Authorization": owner, "Idempotency-Key": "resume-once"}, timeout=30)
    after = ctx.sql("SELECT row_version, generation FROM runs WHERE run_id = %s", run_id)[0]
    ctx.expect("the resume key with another body: 422 idempotency_key_reused, nothing written",
               reused.status_code == 422 and error_code(reused) == "idempotency_key_reused"
               and after[1] == before[1],
               f"{reused.status_code} {reused.text[:160]}; generation {before[1]} -> {after[1]}",
               "R-CREATE-2", "R-RESUME-1")
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("one new generation", run["generation"] == 2, f"g{run['generation']} {run['state']}", "R-RESUME-1")
    left = runs_not_ended(ctx)
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
    parked = create_with_key(api.base_url, owner, "race-run",
                     {"prompt": make_prompt(steps=2, park={"step": 1, "kind": "input"}), "durable_temporal": True})
    run_id = parked.json()["run_id"]
    ctx.history.record("client", op="create", phase="ok", run_id=run_id, status=202)
    ctx.wait_state(api, run_id, "awaiting_input")

    def resume() -> httpx.Response:
        return http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", timeout=60,
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
               and second.status_code == 202 and not receipt_diff(second.json(), lost.json()),
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
