"""Open event streams at scale and their bounds: two hundred streams on one API while the
control routes are used, at most N streams per run, and the browser's short-lived stream
token (R-EVENT-2..4, R-EVENT-6, R-AUTH-3)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from qimpl.client.stream import parse_sse
from qualify import http
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.procs import wait_until
from qualify.scenarios.base import API_KEY, ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted
from qualify.scenarios.streams import NOTIFY_ONLY, PATH, record_stream_event


@scenario(
    "two-hundred-open-streams",
    title="200 event streams open on one API instance while the control routes (create, cancel, "
          "resume) are used: every control call is answered, every stream ends with its run's "
          "terminal event, and the API holds no pooled connection per stream (p99 is a figure; "
          "its bound is measured in bench/streams.py)",
    requirements=("R-EVENT-2", "R-EVENT-3", "R-EVENT-4"),
)
def two_hundred_open_streams(ctx: ScenarioContext) -> None:
    import asyncio
    import statistics

    api = ctx.processes.api(**NOTIFY_ONLY)
    ctx.processes.worker()
    runs = []
    for i in range(20):
        resp = ctx.create_run(api, prompt=make_prompt(steps=12, delay_ms=250, answer=f"s{i}"))
        if resp is None or resp.status_code != 202:
            raise HarnessError("a streamed run was not accepted")
        runs.append((resp.json()["run_id"], resp.json()["stream_key"]))
    ended: list[str] = []
    opened = threading.Event()
    #: Each stream's SSE lines, by stream number: parsed and recorded in the history once
    #: every stream ended (the stream checker judges each as a client: every journal event
    #: once, in order, the terminal one with the run's final state).
    lines_of: dict[int, list[str]] = {}

    async def follow(n: int, run_id: str, key: str, client: httpx.AsyncClient, started: list[int]) -> None:
        last = "?"
        lines = lines_of.setdefault(n, [])
        async with client.stream("GET", PATH.format(run_id=run_id), headers={"X-Stream-Key": key}) as resp:
            started.append(resp.status_code)
            if len(started) == 200:
                opened.set()
            async for line in resp.aiter_lines():
                lines.append(line)
                if line.startswith("event:"):
                    last = line.removeprefix("event:").strip()
        lines.append("")  # the end of a last event not followed by a blank line
        ended.append(last)

    async def streams() -> None:
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
        async with http.async_client(base_url=api.base_url, timeout=120, limits=limits) as client:
            started: list[int] = []
            await asyncio.gather(*(follow(i, *runs[i % 20], client, started) for i in range(200)))

    reader = threading.Thread(target=lambda: asyncio.run(streams()), daemon=True)
    reader.start()
    if not opened.wait(60):
        raise HarnessError("200 streams did not open within 60 s")
    sessions = ctx.sql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'qimpl_api'"
                       " AND datname = current_database()")[0][0]
    took: list[float] = []
    codes: list[int] = []
    auth = {"Authorization": f"Bearer {API_KEY}"}
    for i in range(15):
        t0 = time.monotonic()
        parked = http.post(f"{api.base_url}/v1/agents/agent-1/runs", timeout=30, headers={
            **auth, "Idempotency-Key": f"control-{i}"}, json={
            "prompt": make_prompt(steps=2, park={"step": 1, "kind": "input"}), "durable_temporal": True})
        took.append(time.monotonic() - t0)
        codes.append(parked.status_code)
        if parked.status_code != 202:
            continue
        run_id = parked.json()["run_id"]
        ctx.history.record("client", op="create", phase="ok", run_id=run_id, key=f"control-{i}")
        base = f"{api.base_url}/v1/agents/agent-1/runs/{run_id}"
        if i % 2:
            ctx.wait_state(api, run_id, "awaiting_input")
            t0 = time.monotonic()
            resumed = http.post(f"{base}/resume", timeout=30, json={"additional_prompt": "go"},
                                 headers={**auth, "Idempotency-Key": f"resume-{i}"})
            took.append(time.monotonic() - t0)
            codes.append(resumed.status_code)
        t0 = time.monotonic()
        cancelled = http.post(f"{base}/cancel", timeout=30, headers=auth)
        took.append(time.monotonic() - t0)
        codes.append(cancelled.status_code)
    reader.join(timeout=120)
    ctx.figures["control_p99_s_with_200_streams"] = round(statistics.quantiles(took, n=100)[98], 3)
    ctx.figure("api_db_sessions_with_200_streams", float(sessions), at_most=12)
    ctx.expect("every control call with 200 streams open was answered without a server error",
               all(c < 500 for c in codes) and codes.count(202) >= 15, str(sorted(set(codes))), "R-EVENT-4")
    ctx.expect("every one of the 200 streams ended with its run's terminal event",
               len(ended) == 200 and set(ended) == {"terminal"},
               f"{len(ended)} ended; last events {sorted(set(ended))}", "R-EVENT-2", "R-EVENT-3")
    ctx.expect("no pooled connection per stream: the API's sessions stay within its pool and listener",
               sessions <= 12, f"{sessions} sessions of qimpl_api with 200 streams open", "R-EVENT-2")
    finals = {run_id: ctx.wait_terminal(api, run_id, timeout_s=60)["state"] for run_id, _ in runs}
    journals: dict[str, list[int]] = {}
    for run_id, seq in ctx.sql("SELECT run_id::text, seq FROM run_events WHERE run_id = ANY(%s::uuid[])"
                               " ORDER BY run_id, seq", [r for r, _ in runs]):
        journals.setdefault(run_id, []).append(int(seq))
    wrong: list[str] = []
    for n in range(200):
        run_id = runs[n % 20][0]
        client = f"stream-{n}"
        ctx.history.record("stream_open", run_id=run_id, client=client, process=api.name, after=0)
        events = list(parse_sse(lines_of.get(n, [])))
        for event in events:
            record_stream_event(ctx, run_id, event, api.name, client)
        ids = [e.id for e in events]
        last = events[-1] if events else None
        if ids != journals.get(run_id) or last is None or last.event != "terminal" \
                or last.data.get("state") != finals[run_id]:
            wrong.append(f"stream {n}: ids {ids[:40]} vs journal {journals.get(run_id, [])[:40]}; last "
                         f"{last and last.event} {last and last.data.get('state')} vs run {finals[run_id]}")
    ctx.expect("every stream delivered its run's journal once each, in order, its terminal event "
               "carrying the run's final state", not wrong,
               "; ".join(wrong[:3]) or f"200 streams of {len(runs)} runs as their journals",
               "R-EVENT-2", "R-EVENT-3", judged=200)


def _open_status(client: httpx.Client, url: str, headers: dict[str, str]
                 ) -> tuple[int, str | None, str | None]:
    """The status of one more stream, its error code if it was refused and its
    ``Retry-After``; the stream itself (if one was opened) is closed at once, never read."""
    with client.stream("GET", url, headers=headers) as resp:
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.status_code, json.loads(resp.read()).get("code"), resp.headers.get("retry-after")
        return resp.status_code, None, resp.headers.get("retry-after")


@scenario(
    "streams-per-run-bounded",
    title="With QIMPL_EVENT_STREAMS_PER_RUN=2, two streams of a live run are open: a third is "
          "429 too_many_streams, by key, after an event or by stream token (a leaked stream key "
          "cannot open unbounded streams); once one closes, a new stream opens again",
    requirements=("R-EVENT-2",),
)
def streams_per_run_bounded(ctx: ScenarioContext) -> None:
    import contextlib

    api = ctx.processes.api(QIMPL_EVENT_STREAMS_PER_RUN="2", QIMPL_EVENT_PING_S="0.3")
    ctx.processes.worker()
    resp = ctx.create_run(api, prompt=make_prompt(steps=3, answer="bounded",
                                                  barrier={"step": 2, "name": "held"}))
    if resp is None or resp.status_code != 202:
        raise HarnessError("the run was not accepted")
    run_id, key = resp.json()["run_id"], resp.json()["stream_key"]
    ctx.wait_barrier("held")
    url, headers = f"{api.base_url}{PATH.format(run_id=run_id)}", {"X-Stream-Key": key}
    with http.client(timeout=httpx.Timeout(10.0, read=5.0)) as client:
        streams = [contextlib.ExitStack() for _ in range(2)]
        opened, readers = [], []
        for stack in streams:
            stream = stack.enter_context(client.stream("GET", url, headers=headers))
            # The reader is kept: closing it would close the stream.
            readers.append(lines := stream.iter_lines())
            first = ""
            for _ in range(100):  # the first non-empty line (a stream that ends gives "")
                if first := next(lines, ""):
                    break
            opened.append((stream.status_code, first.split(":")[0]))
        ctx.expect("two streams of the run open", all(s == 200 for s, _ in opened), str(opened),
                   "R-EVENT-2")
        third = _open_status(client, url, headers)
        # However the third asks: resuming after an event, or with a browser's stream token.
        resumed = _open_status(client, url, {**headers, "Last-Event-ID": "1"})
        minted = _token(api, run_id)
        token = minted.json().get("token", "") if minted.status_code == 200 else ""
        by_token = _open_status(client, f"{url}?stream_token={token}", {}) if token else (minted.status_code, None, None)
        tries = {"key": third, "key and Last-Event-ID": resumed, "stream token": by_token}
        ctx.expect("a third stream of the run is 429 too_many_streams with Retry-After, by key, after an "
                   "event or by token",
                   all(t[:2] == (429, "too_many_streams") and bool(t[2]) for t in tries.values()),
                   str(tries), "R-EVENT-2", judged=len(tries))
        streams[0].close()
        deadline = time.monotonic() + 10
        again = _open_status(client, url, headers)
        while again[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            again = _open_status(client, url, headers)
        ctx.expect("once one closes, a new stream opens", again[0] == 200, str(again), "R-EVENT-2")
        streams[1].close()
    ctx.release_barrier("held")
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("the run completes", run["state"] == "completed", str(run["state"]))


BROWSER_ORIGIN = "http://app.example.test"


def _token(api: ManagedProcess, run_id: str, ttl_s: int = 300) -> httpx.Response:
    return http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/stream-token", json={"ttl_s": ttl_s},
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=15)


def _by_token(ctx: ScenarioContext, api: ManagedProcess, run_id: str, token: str, *,
              last_event_id: str | None = None, client: str = "browser") -> tuple[int, list[dict[str, Any]], str]:
    """``(status, events, body)`` of one token-authenticated stream, read to its end,
    recorded in the history as a stream client."""
    headers = {"Origin": BROWSER_ORIGIN, **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    ctx.history.record("stream_open", run_id=run_id, client=client, process=api.name,
                       after=int(last_event_id) if last_event_id else 0)
    got: list[dict[str, Any]] = []
    with http.stream("GET", f"{api.base_url}{PATH.format(run_id=run_id)}", params={"stream_token": token},
                      headers=headers, timeout=60) as resp:
        if resp.status_code != 200:
            return resp.status_code, [], resp.read().decode()[:200]
        for event in parse_sse(resp.iter_lines()):
            record_stream_event(ctx, run_id, event, api.name, client)
            got.append({"id": str(event.id), "event": event.event})
    return 200, got, ""


@scenario(
    "browser-stream-token",
    title="A browser's path to a run's events (EventSource cannot send headers): a stream token "
          "minted by the run's owner in the query, from an allowed origin: every event once, "
          "ending with the terminal event, then 204; another run's, a forged or an expired "
          "token is 401; an origin not on the allow-list gets no CORS grant; the token never "
          "reaches the access log",
    requirements=("R-EVENT-6", "R-EVENT-2", "R-AUTH-3"),
)
def browser_stream_token(ctx: ScenarioContext) -> None:
    api = ctx.processes.spawn_api("api-1", env={"QIMPL_CORS_ORIGINS": json.dumps([BROWSER_ORIGIN])},
                                  access_log=True).wait_ready()
    ctx.processes.worker()
    run_id = accepted(ctx, api, prompt=make_prompt(steps=3, answer="to the browser",
                                                   barrier={"step": 2, "name": "browser"}))
    other = accepted(ctx, api, prompt=make_prompt(steps=1, answer="another run"))
    minted = _token(api, run_id)
    token = minted.json().get("token", "") if minted.status_code == 200 else ""
    key = ctx.sql("SELECT stream_key FROM runs WHERE run_id = %s", run_id)[0][0]
    ctx.expect("the run's owner gets a stream token that does not carry the stream key",
               minted.status_code == 200 and bool(token) and key not in token
               and minted.json().get("events_path", "").endswith(f"stream_token={token}"),
               f"{minted.status_code}", "R-EVENT-6")
    # While the run is live (held at step 2), a browser's reconnection with an id the run
    # never sent is refused; after the run ended it gets 204 like any other (below).
    ctx.wait_barrier("browser")
    # Only the status and, for a JSON answer, its code: a stream (the defect) would wait for
    # events that never come, so it is left at its headers, never read.
    with http.stream("GET", f"{api.base_url}{PATH.format(run_id=run_id)}", params={"stream_token": token},
                      headers={"Origin": BROWSER_ORIGIN, "Last-Event-ID": "99999999"}, timeout=15) as resp:
        live_code = (json.loads(resp.read()).get("code")
                     if resp.headers.get("content-type", "").startswith("application/json") else None)
    ctx.expect("a Last-Event-ID the live run never issued is 400 last_event_id_unknown (stream token)",
               (resp.status_code, live_code) == (400, "last_event_id_unknown"), f"{resp.status_code} {live_code}",
               "R-EVENT-6")
    ctx.release_barrier("browser")
    status, events, body = _by_token(ctx, api, run_id, token)
    journal = [str(i) for (i,) in ctx.sql("SELECT seq FROM run_events WHERE run_id = %s ORDER BY seq", run_id)]
    ctx.expect("with the token in the query: every event once, in order, ending with the terminal event",
               status == 200 and [e["id"] for e in events] == journal and events[-1]["event"] == "terminal",
               f"{status} {body} {[e['id'] for e in events]} vs {journal}", "R-EVENT-6", "R-EVENT-2",
               judged=len(journal))
    again, _, _ = _by_token(ctx, api, run_id, token, last_event_id=journal[-1] if journal else "0",
                            client="browser-reconnect")
    ctx.expect("the browser's reconnection after the terminal event gets 204 (EventSource stops)",
               again == 204, str(again), "R-EVENT-6")
    unknown, _, body = _by_token(ctx, api, run_id, token, last_event_id="99999999", client="browser-unknown")
    ctx.expect("after the run ended, a Last-Event-ID it never issued gets 204 as any reconnection (no replay)",
               unknown == 204, f"{unknown} {body}", "R-EVENT-6")
    theirs = _token(api, other).json().get("token", "")
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    short = _token(api, run_id, ttl_s=1).json().get("token", "")
    wait_until(lambda: ctx.sql("SELECT extract(epoch FROM clock_timestamp()) > %s", int(short.split(".")[3]))[0][0],
               timeout_s=10, what="the short token's expiry on the database's clock")
    # The expired token with its expiry moved an hour on: the MAC covers the expiry.
    parts = short.split(".")
    extended = ".".join([*parts[:3], str(int(parts[3]) + 3600), *parts[4:]]) if len(parts) > 3 else "x"
    refusals = {}
    for name, bad in (("another run's token", theirs), ("a forged token", forged), ("an expired token", short),
                      ("an expired token with its expiry moved later", extended),
                      ("no credential at all", "")):
        params = {"stream_token": bad} if bad else {}
        resp = http.get(f"{api.base_url}{PATH.format(run_id=run_id)}", params=params, timeout=15)
        refusals[name] = f"{resp.status_code} {resp.json().get('code') if resp.status_code != 200 else ''}"
    want = {"another run's token": "401 stream_token_invalid", "a forged token": "401 stream_token_invalid",
            "an expired token": "401 stream_token_expired",
            "an expired token with its expiry moved later": "401 stream_token_invalid",
            "no credential at all": "401 stream_key_required"}
    ctx.expect("another run's, a forged, an expired and a re-dated token, and none, are refused with their codes",
               refusals == want, str(refusals), "R-EVENT-6", "R-AUTH-3", judged=len(want))
    allowed = http.options(f"{api.base_url}{PATH.format(run_id=run_id)}", timeout=15, headers={
        "Origin": BROWSER_ORIGIN, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "last-event-id"})
    stranger = http.get(f"{api.base_url}/healthz", headers={"Origin": "http://evil.example.test"}, timeout=15)
    # An origin that only begins like the allowed one is another site.
    lookalike = http.get(f"{api.base_url}/healthz", headers={"Origin": BROWSER_ORIGIN + ".evil.example"},
                         timeout=15)
    friend = http.get(f"{api.base_url}/healthz", headers={"Origin": BROWSER_ORIGIN}, timeout=15)
    ctx.expect("CORS: the allowed origin's preflight and request are granted; another origin, or one "
               "that only begins like it, is not",
               allowed.status_code == 200
               and allowed.headers.get("access-control-allow-origin") == BROWSER_ORIGIN
               and "last-event-id" in allowed.headers.get("access-control-allow-headers", "").lower()
               and friend.headers.get("access-control-allow-origin") == BROWSER_ORIGIN
               and "access-control-allow-origin" not in stranger.headers
               and "access-control-allow-origin" not in lookalike.headers,
               f"preflight {allowed.status_code} {dict(allowed.headers).get('access-control-allow-origin')}; "
               f"stranger {dict(stranger.headers).get('access-control-allow-origin')}", "R-EVENT-6")
    log = api.log_path.read_text(errors="replace")
    logged = log.count("stream_token=<redacted>")
    # Every process's log, and a token cut short too (the forged one is the live token but
    # for its last two characters: a log of it would all but give the token away).
    logs = {p.name: p.read_text(errors="replace") for p in api.log_path.parent.glob("*.log")}
    seen = sorted(name for name, text in logs.items()
                  for t in (token, short, theirs, token[:-2]) if t and t in text)
    ctx.expect("the access log shows each token request redacted; no log holds a token or most of one",
               logged >= 3 and not seen, f"{logged} redacted request lines; tokens in {seen}",
               "R-EVENT-6", judged=logged)
    ctx.wait_terminal(api, other)
