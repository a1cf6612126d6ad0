"""The run's event stream (R-EVENT-1..5, R-AUTH-3, R-Q-5): read part of it from one API,
drop the connection, resume with Last-Event-ID on another; two clients follow a run through
an API that is SIGKILLed; the API's LISTEN connection is terminated while events are
written; expired streams are pruned by several reconcilers at once. Clients follow streams
with ``qimpl.client.stream`` (what an application would use)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from qimpl.client.stream import FollowResult, StreamEvent, follow_run
from qualify import http
from qualify.errors import HarnessError
from qualify.fakes.synthetic import delta_piece, make_prompt
from qualify.processes import ManagedProcess
from qualify.procs import wait_until
from qualify.scenarios.base import API_KEY, TERMINAL, ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted
from qualify.scenarios.streams import NOTIFY_ONLY, PATH, read_stream, record_stream_event

#: The API's LISTEN session (``qimpl.api.deps.Services``) and its database role.
LISTEN_APPLICATION = "qimpl-api-listen"
API_ROLE = "qimpl_api"


def _streamed_while_running(events: list[dict[str, Any]], *, steps: int,
                            pieces: int) -> tuple[str, bool, str, str]:
    """A check (name, ok, detail, requirement) that each step's output arrived as it was
    produced: its ``output`` delta events (``partial``) come before the step's checkpoint
    and, for the attempt that checkpointed it, join to exactly the pieces the synthetic
    provider streamed (R-EVENT-1)."""
    deltas: dict[tuple[int, int], list[str]] = {}
    order: dict[int, int] = {}
    bad = []
    for i, e in enumerate(events):
        data = json.loads(e.get("data") or "{}")
        if e.get("event") == "output" and data.get("partial"):
            deltas.setdefault((int(data["step"]), int(data["attempt"])), []).append(data["delta"])
            order.setdefault(int(data["step"]), i)
        elif e.get("event") == "checkpoint":
            step = int(data.get("checkpoint_step") or data.get("step") or 0)
            if step and (step not in order or order[step] > i):
                bad.append(f"step {step}: checkpoint before any streamed output")
    for step in range(1, steps + 1):
        joined = {attempt: "".join(parts) for (s, attempt), parts in deltas.items() if s == step}
        want = {a: "".join(delta_piece(step, a, i) for i in range(pieces)) for a in joined}
        if not joined or joined != want:
            bad.append(f"step {step}: streamed {joined}, expected {want or 'some output'}")
    return ("each step's output streamed before its checkpoint, piece by piece", not bad,
            "; ".join(bad[:4]) or f"{sum(len(v) for v in deltas.values())} delta events", "R-EVENT-1")


#: event-streams-pruned's event retention, seconds: longer than its reconcilers take to
#: start after the last cancel, so that a prune ignoring it would be seen.
PRUNE_RETENTION_S = 2.0
#: event-streams-pruned: how many of its 250 runs end just before the reconcilers start
#: (their streams within the retention at the first sweeps); the others end a retention
#: earlier.
PRUNE_FRESH = 20
#: The run record's fields a terminal event carries, compared with GET run (R-EVENT-3).
TERMINAL_FIELDS = ("state", "row_version", "generation", "result_json", "error_code", "error_message",
                   "last_failure_code", "usage")


class Follower:
    """A client following a run with ``follow_run`` in a thread, recording every event."""

    def __init__(self, ctx: ScenarioContext, name: str, apis: list[ManagedProcess], run_id: str,
                 key: str, *, deadline_s: float = 30.0) -> None:
        self.name, self.result, self.error = name, FollowResult(), ""
        #: Event id -> when it arrived (this host's clock, epoch s).
        self.arrived: dict[int, float] = {}
        urls = {a.base_url: a.name for a in apis}

        def on_event(event: StreamEvent, base: str) -> None:
            self.arrived[event.id] = time.time()
            record_stream_event(ctx, run_id, event, urls[base], name)
            self.result.events.append(event)

        def follow() -> None:
            try:
                with http.client(timeout=httpx.Timeout(10.0, read=60.0)) as client:
                    done = follow_run(list(urls), "agent-1", run_id, stream_key=key, api_key=API_KEY,
                                      deadline_s=deadline_s, max_reconnects=50, backoff_s=(0.05, 0.5),
                                      on_event=on_event, client=client)
                self.result.terminal, self.result.run = done.terminal, done.run
                self.result.connections, self.result.ended = done.connections, done.ended
                self.result.resent = done.resent
            except Exception as exc:  # noqa: BLE001 - reported by the scenario's checks
                self.error = f"{type(exc).__name__}: {exc}"[:200]

        self.thread = threading.Thread(target=follow, name=f"follow-{name}", daemon=True)
        self.thread.start()

    def wait_events(self, n: int, timeout_s: float = 20.0) -> bool:
        """Whether ``n`` events arrived within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while len(self.result.events) < n:
            if time.monotonic() > deadline or not self.thread.is_alive():
                return False
            time.sleep(0.02)
        return True

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)


#: The median delay from an event's write to its arrival at a follower woken by NOTIFY,
#: seconds: milliseconds when the wake-ups work; a fallback read every second (a missed
#: NOTIFY) gives about half a second.
WOKEN_MEDIAN_S = 0.3


def _woken(ctx: ScenarioContext, followers: list[Follower], n: int, run_id: str) -> bool:
    """Check that every follower got the first ``n`` events as they committed: each one,
    and with a median delay from the event's write (``run_events.at``, the database's
    clock, this host's) to its arrival of at most ``WOKEN_MEDIAN_S``."""
    got = [f.wait_events(n) for f in followers]
    written = dict(ctx.sql("SELECT seq, extract(epoch FROM at)::float8 FROM run_events WHERE run_id = %s"
                           " AND seq <= %s", run_id, n))
    medians = {}
    for f in followers:
        # Only the events written after the follower's first event arrived (its stream was
        # open by then): earlier ones come with its first read, whatever wakes it.
        opened = min(f.arrived.values(), default=float("inf"))
        delays = sorted(f.arrived[i] - float(t) for i, t in written.items()
                        if i in f.arrived and float(t) > opened)
        medians[f.name] = round(delays[len(delays) // 2], 3) if delays else None
    ctx.figures["stream_wake_median_s"] = max((m for m in medians.values() if m is not None), default=-1.0)
    # A follower that connected after all of them were written (a slow start) judges no
    # delay: its events came with its first read.
    timed = [m for m in medians.values() if m is not None]
    return ctx.expect(f"the followers were woken for each of the first {n} events as they were written "
                      f"(NOTIFY, median delay at most {WOKEN_MEDIAN_S:g} s; no fallback read)",
                      all(got) and all(m <= WOKEN_MEDIAN_S for m in timed),
                      f"{[len(f.result.events) for f in followers]} events; median delays {medians}"
                      " (None: connected after they were written)", "R-EVENT-2", judged=len(timed))


def _event_journal(ctx: ScenarioContext, run_id: str) -> list[int]:
    return [int(r[0]) for r in ctx.sql("SELECT seq FROM run_events WHERE run_id = %s ORDER BY seq", run_id)]


def _keep_alive(api: ManagedProcess, run_id: str, key: str, *, after: int) -> str:
    """The first line of a stream resumed after event ``after`` while nothing new is
    written: a keep-alive comment (``: ping …``) if the API sends them; else what came."""
    headers = {"X-Stream-Key": key, "Last-Event-ID": str(after)}
    try:
        with http.stream("GET", f"{api.base_url}{PATH.format(run_id=run_id)}", headers=headers,
                          timeout=httpx.Timeout(10.0, read=5.0)) as resp:
            for line in resp.iter_lines():
                if line:
                    return line
    except httpx.HTTPError as exc:
        return f"no line: {type(exc).__name__}"
    return "no line: the stream ended"


def _admin(ctx: ScenarioContext, statement: str) -> None:
    """One statement as the stack's administrator (no result rows)."""
    import psycopg

    with psycopg.connect(ctx.deployment.dsn, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]  # a constant of this module


def _check_followers(ctx: ScenarioContext, followers: list[Follower], run_id: str, api: ManagedProcess,
                     *reqs: str) -> None:
    """Every follower got every journal event exactly once, in order, ending with the
    terminal event, and that event equals the run record."""
    record = ctx.read_run(api, run_id)
    journal = _event_journal(ctx, run_id)
    for f in followers:
        ids = [e.id for e in f.result.events]
        # The client skips an event a server sends again; it says which, and none may be.
        ctx.expect(f"{f.name}: every event exactly once (none sent again), in order, ending with the "
                   "terminal event",
                   not f.error and ids == journal and f.result.ended == "terminal" and not f.result.resent,
                   f"got {ids} ended {f.result.ended!r} {f.error}; sent again {f.result.resent}; "
                   f"journal {journal}", *reqs)
        term = f.result.terminal.data if f.result.terminal else {}
        differ = {k: (term.get(k), record.get(k)) for k in TERMINAL_FIELDS if term.get(k) != record.get(k)}
        ctx.expect(f"{f.name}: the terminal event equals GET run (state, result, error, usage)",
                   bool(term) and not differ, str(differ) or "equal", "R-EVENT-3",
                   judged=len(TERMINAL_FIELDS))


@scenario(
    "event-stream",
    title="Read a run's events from one API, drop the connection, resume with Last-Event-ID on "
          "another: nothing lost or repeated, the run is not cancelled, the stream ends with its "
          "terminal state; a stream key works only for its own run",
    requirements=("R-EVENT-1", "R-EVENT-2", "R-EVENT-3", "R-EVENT-4", "R-AUTH-3"),
)
def event_stream(ctx: ScenarioContext) -> None:
    apis = [ctx.processes.api("api-1"), ctx.processes.api("api-2")]
    ctx.processes.worker()
    resp = ctx.create_run(apis[0], prompt=make_prompt(steps=5, delay_ms=150, answer="streamed",
                                                      deltas=3))
    assert resp is not None
    run_id, key = resp.json()["run_id"], resp.json()["stream_key"]
    first = read_stream(ctx, apis[0], run_id, key, stop_after=3)
    ctx.expect("three events read, then the client hung up", len(first) == 3 and "id" in first[-1],
               str([e.get("event") for e in first]), "R-EVENT-2")
    rest = read_stream(ctx, apis[1], run_id, key, last_event_id=first[-1]["id"])
    ctx.expect("the stream resumed on another API instance and ended with a terminal event",
               bool(rest) and rest[-1].get("event") == "terminal", str([e.get("event") for e in rest]),
               "R-EVENT-2", "R-EVENT-3")
    run = ctx.wait_terminal(apis[0], run_id)
    ctx.expect("hanging up did not cancel the run: it completed", run["state"] == "completed",
               run["state"], "R-EVENT-4")
    last = rest[-1] if rest and rest[-1].get("event") == "terminal" else {}
    term = json.loads(last["data"]) if isinstance(last.get("data"), str) else {}
    differ = {k: (term.get(k), run.get(k)) for k in TERMINAL_FIELDS if term.get(k) != run.get(k)}
    ctx.expect("the terminal event equals GET run (state, result, error, usage)", bool(term) and not differ,
               str(differ) or "equal", "R-EVENT-3", judged=len(TERMINAL_FIELDS))
    if rest and "id" in rest[-1]:
        after = read_stream(ctx, apis[0], run_id, key, last_event_id=rest[-1]["id"])
        ctx.expect("reconnecting after the terminal event: 204, nothing more (a client stops)",
                   after == [{"status": 204, "body": ""}], str(after)[:200], "R-EVENT-3")
    kinds = {e.get("event") for e in first + rest}
    ctx.expect("the journal has state changes, checkpoints, usage and the answer's output event",
               {"state", "checkpoint", "output", "usage"} <= kinds, str(sorted(k for k in kinds if k)),
               "R-EVENT-1")
    ctx.expect(*_streamed_while_running(first + rest, steps=5, pieces=3))
    other = accepted(ctx, apis[0], prompt=make_prompt(steps=1))
    borrowed = read_stream(ctx, apis[0], other, key)
    ctx.expect("this run's stream key is refused for another run (404)",
               bool(borrowed) and borrowed[0].get("status") == 404, str(borrowed)[:120], "R-AUTH-3")
    foreign = http.post(f"{apis[0].base_url}/v1/agents/agent-1/runs", timeout=15,
                         json={"prompt": make_prompt(steps=1), "durable_temporal": True},
                         headers={"Authorization": "Bearer other-key", "Idempotency-Key": "foreign"})
    tenant_key = foreign.json().get("stream_key", "")
    crossed = read_stream(ctx, apis[0], run_id, tenant_key)
    ctx.expect("another tenant's stream key is refused (404)",
               bool(crossed) and crossed[0].get("status") == 404, str(crossed)[:120], "R-AUTH-3")
    nokey = http.get(f"{apis[0].base_url}{PATH.format(run_id=run_id)}", timeout=10)
    ctx.expect("no stream key: 401 stream_key_required",
               nokey.status_code == 401 and nokey.json().get("code") == "stream_key_required",
               nokey.text[:120], "R-AUTH-3")
    # The two runs made only to borrow their keys end before the scenario does (every
    # accepted run must reach a terminal state), not by luck during the teardown.
    wait_until(lambda: not ctx.sql("SELECT 1 FROM runs WHERE state <> ALL(%s)", list(TERMINAL)),
               timeout_s=30, what="every run of the scenario terminal", kind="wait_run")


@scenario(
    "stream-survives-api-kill",
    exec_because="the API's entry point SIGKILLed under an open event stream", exec_kinds=("api",),
    title="Two clients follow one run through API instance X; X is SIGKILLed mid-stream; they "
          "reconnect to Y with Last-Event-ID: every event exactly once, in order, ending with "
          "the terminal event equal to GET run",
    requirements=("R-EVENT-2", "R-EVENT-3", "R-EVENT-4", "R-Q-5"),
    faults=("sigkill of the API serving the streams",),
)
def stream_survives_api_kill(ctx: ScenarioContext) -> None:
    x, y = ctx.processes.api("api-x", **NOTIFY_ONLY), ctx.processes.api("api-y", **NOTIFY_ONLY)
    ctx.processes.worker()
    resp = ctx.create_run(x, prompt=make_prompt(steps=6, delay_ms=50, answer="followed",
                                                barrier={"step": 4, "name": "mid-stream"}))
    if resp is None or resp.status_code != 202:
        raise HarnessError("the run was not accepted")
    run_id, key = resp.json()["run_id"], resp.json()["stream_key"]
    followers = [Follower(ctx, f"client-{i}", [x, y], run_id, key) for i in (1, 2)]
    ctx.wait_barrier("mid-stream")
    _woken(ctx, followers, 5, run_id)  # the first five: states, usage and checkpoints before the barrier
    fault = ctx.nemesis.sigkill(x, while_streaming=run_id)
    ctx.release_barrier("mid-stream")
    for f in followers:
        f.join(40)
    ctx.expect("X was killed while both clients were mid-stream", bool(fault["landed"]),
               json.dumps(fault.get("evidence", {}), default=str)[:200])
    _check_followers(ctx, followers, run_id, y, "R-EVENT-2", "R-EVENT-3")
    moved = all(y.base_url in f.result.connections[1:] for f in followers)
    ctx.expect("both clients reconnected to Y", moved,
               str([f.result.connections for f in followers]), "R-EVENT-2")
    ctx.expect("losing the stream's API did not cancel the run: it completed",
               ctx.read_run(y, run_id)["state"] == "completed", "", "R-EVENT-4")


@scenario(
    "stream-survives-listener-loss",
    title="The API's LISTEN connection is terminated (pg_terminate_backend) and cannot come "
          "back while the run writes its last events; once it does, subscribers still get "
          "every event (a catch-up read after the resubscribe), with no fallback poll to help",
    requirements=("R-EVENT-2", "R-EVENT-3", "R-Q-5"),
    faults=(f"pg_terminate_backend of {LISTEN_APPLICATION}",),
)
def stream_survives_listener_loss(ctx: ScenarioContext) -> None:
    api = ctx.processes.api(QIMPL_EVENT_PING_S="0.3", **NOTIFY_ONLY)
    ctx.processes.worker()
    resp = ctx.create_run(api, prompt=make_prompt(steps=4, delay_ms=20, answer="caught up",
                                                  barrier={"step": 3, "name": "quiet"}))
    if resp is None or resp.status_code != 202:
        raise HarnessError("the run was not accepted")
    run_id, key = resp.json()["run_id"], resp.json()["stream_key"]
    followers = [Follower(ctx, f"subscriber-{i}", [api], run_id, key, deadline_s=45) for i in (1, 2)]
    ctx.wait_barrier("quiet")
    # Everything before the barrier is committed: states, two steps' usage and checkpoints.
    so_far = len(_event_journal(ctx, run_id))
    _woken(ctx, followers, so_far, run_id)
    ping = _keep_alive(api, run_id, key, after=so_far)
    ctx.expect("a quiet stream gets keep-alive comments", ping.startswith(":"), ping[:80], "R-EVENT-2")
    # An id the live run never sent (beyond its journal, or a 20-digit number) is refused,
    # not answered with a stream that waits for events that never come (issue 22, item 10).
    for what, unknown in (("one past the journal", str(so_far + 1)), ("a 20-digit number", "9" * 20)):
        # Only the status and, for a JSON answer, its code: a stream (the defect) is left
        # at its headers, never read.
        with http.stream("GET", f"{api.base_url}{PATH.format(run_id=run_id)}", timeout=10.0,
                          headers={"X-Stream-Key": key, "Last-Event-ID": unknown}) as resp:
            json_answer = resp.headers.get("content-type", "").startswith("application/json")
            code = json.loads(resp.read()).get("code") if json_answer else None
        ctx.expect(f"a Last-Event-ID beyond the live run's journal ({what}) is 400 "
                   "last_event_id_unknown", (resp.status_code, code) == (400, "last_event_id_unknown"),
                   f"{resp.status_code} {code}", "R-EVENT-2")
    before = ctx.sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s", LISTEN_APPLICATION)
    try:
        # The listener cannot reconnect until the run has written everything.
        _admin(ctx, f"ALTER ROLE {API_ROLE} CONNECTION LIMIT 0")
        fault = ctx.nemesis.terminate_backend(ctx.deployment.dsn, LISTEN_APPLICATION)
        ctx.release_barrier("quiet")
        deadline = time.monotonic() + 30
        while ctx.sql("SELECT state FROM runs WHERE run_id = %s", run_id)[0][0] != "completed":
            if time.monotonic() > deadline:
                raise HarnessError("the run did not complete")
            time.sleep(0.05)
        written = len(_event_journal(ctx, run_id))
        delivered = [len(f.result.events) for f in followers]
    finally:
        _admin(ctx, f"ALTER ROLE {API_ROLE} CONNECTION LIMIT -1")
    deadline = time.monotonic() + 30
    while not (after := ctx.sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                LISTEN_APPLICATION)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for f in followers:
        f.join(40)
    ctx.expect("the LISTEN session was terminated and a new one took its place",
               bool(fault["landed"]) and bool(after) and set(after).isdisjoint(before),
               f"before {before}, after {after}")
    ctx.expect("events were written while nobody listened",
               all(d < written for d in delivered), f"delivered {delivered} of {written} by then")
    _check_followers(ctx, followers, run_id, api, "R-EVENT-2", "R-EVENT-3")


#: How soon a pruned stream must answer its 410: a liveness bound, far above the
#: milliseconds it takes, far below the listener waits a hang would show (30 s and more).
PRUNED_ANSWER_S = 5.0


@scenario(
    "event-streams-pruned",
    title=f"250 ended runs with a {PRUNE_RETENTION_S:g} s event retention and three reconcilers at once: "
          "every expired stream pruned exactly once, never before its retention, at most 100 per "
          "tenant per sweep; a pruned stream answers 410 event_stream_pruned, with or without "
          "Last-Event-ID, the run record stays; a live run's stream is kept",
    requirements=("R-EVENT-5", "R-OPS-3", "R-Q-5"),
)
def event_streams_pruned(ctx: ScenarioContext) -> None:
    from qualify.scenarios.sweeps import RECONCILE

    # The database keeps a stream at least its owner's floor (60 s by default, whatever
    # retention a reconciler asks; tests/integration/test_worker_functions.py): lowered
    # to 0 here, as an owner may, so that the reconcilers' own 2 s retention is judged.
    ctx.sql("UPDATE event_retention_floor SET seconds = 0 RETURNING seconds")
    api = ctx.processes.api()
    n = 250
    with ThreadPoolExecutor(max_workers=8) as pool:
        run_ids = list(pool.map(lambda i: accepted(ctx, api, prompt=make_prompt(steps=1), key=f"pr-{i}"),
                                range(n)))
        # Two cohorts: the first's streams are all past their retention before the second's
        # runs end, so the reconcilers' first sweeps find more than 100 expired streams (the
        # bound is met, whatever the cancels' pace under load; spread over seconds, each
        # sweep found fewer and an unbounded prune passed) and some that must wait.
        ended, fresh = run_ids[:n - PRUNE_FRESH], run_ids[n - PRUNE_FRESH:]
        list(pool.map(lambda r: ctx.cancel_run(api, r), ended))
        wait_until(lambda: bool(ctx.sql(
            "SELECT clock_timestamp() > max(coalesce(completed_at, accepted_at))"
            " + make_interval(secs => %s) FROM runs WHERE run_id = ANY(%s::uuid[])",
            PRUNE_RETENTION_S + 0.1, ended)[0][0]), timeout_s=30, what="the first cohort's retention")
        list(pool.map(lambda r: ctx.cancel_run(api, r), fresh))
    live = ctx.create_run(api, prompt=make_prompt(steps=1), key="still-live")
    if live is None or live.status_code != 202:
        raise HarnessError("the live run was not accepted")
    live_id, live_key = live.json()["run_id"], live.json()["stream_key"]
    keys = dict(ctx.sql("SELECT run_id::text, stream_key FROM runs WHERE run_id = %s", run_ids[0]))
    idle_queue = {"QIMPL_TASK_QUEUE": f"{ctx.deployment.task_queue}-reconcile-only"}
    env = {"QIMPL_EVENT_RETENTION_S": str(PRUNE_RETENTION_S), **RECONCILE, **idle_queue}
    reconcilers = [ctx.processes.spawn_worker(f"reconciler-{i + 1}", env=env) for i in range(3)]
    for proc in reconcilers:  # booted together: their first sweeps overlap
        proc.wait_ready()
    deadline = time.monotonic() + 60
    while ctx.sql("SELECT count(*) FROM run_event_prunes")[0][0] < n:
        if time.monotonic() > deadline:
            raise HarnessError("not every expired stream was pruned within 60 s")
        time.sleep(0.2)
    # A sweep commits its prunes, then its ``reconciler_sweeps`` row (qimpl.reconciler):
    # the last sweep's row may still be on its way when the last prune is seen. Read the
    # accounting once it covers every prune, or after 10 s (then the check below fails).
    sweeps_sql = "SELECT reconciler, pruned FROM reconciler_sweeps WHERE pruned > 0 ORDER BY id"
    deadline = time.monotonic() + 10
    sweeps = ctx.sql(sweeps_sql)
    while sum(p for _, p in sweeps) < n and time.monotonic() < deadline:
        time.sleep(0.05)
        sweeps = ctx.sql(sweeps_sql)
    ctx.expect("at most 100 streams pruned per tenant per sweep, and sweeps account for all",
               max(p for _, p in sweeps) <= 100 and sum(p for _, p in sweeps) == n,
               f"sweeps {[p for _, p in sweeps]}", "R-EVENT-5", "R-OPS-3")
    ctx.expect(f"a sweep met the bound: {n - PRUNE_FRESH} streams were past their retention at the "
               "first sweeps, and one sweep pruned exactly 100 of them",
               max(p for _, p in sweeps) == 100, f"sweeps {[p for _, p in sweeps]}", "R-EVENT-5")
    ctx.figures["reconcilers_that_pruned"] = len({r for r, _ in sweeps})
    twice = ctx.sql("SELECT count(*) FROM run_event_prunes WHERE run_id <> ALL(%s::uuid[])", run_ids)
    left = ctx.sql("SELECT count(*) FROM run_events WHERE run_id = ANY(%s::uuid[])", run_ids)
    ctx.expect("exactly the 250 expired streams pruned, nothing of them left",
               twice[0][0] == 0 and left[0][0] == 0, f"others {twice[0][0]}, left {left[0][0]}", "R-EVENT-5")
    # The reconcilers start within the retention of the last cancel: one that ignored the
    # retention would prune at its first sweep. ``pruned_at`` is the pruning transaction's
    # start, a moment before its statement judged the run old enough: a 0.1 s allowance.
    early = ctx.sql("SELECT min(extract(epoch FROM p.pruned_at - coalesce(r.completed_at, r.accepted_at)))::float8"
                    " FROM run_event_prunes p JOIN runs r USING (run_id)")[0][0]
    ctx.expect(f"no stream pruned before its retention ({PRUNE_RETENTION_S:g} s after its run ended, "
               "the database's clock)", early is not None and early >= PRUNE_RETENTION_S - 0.1,
               f"the earliest prune {early} s after its run ended", "R-EVENT-5", judged=n)
    asked = time.monotonic()
    gone = read_stream(ctx, api, run_ids[0], keys[run_ids[0]])
    answered_s = time.monotonic() - asked
    ctx.figures["pruned_stream_answered_s"] = round(answered_s, 3)
    body = json.loads(gone[0].get("body") or "{}") if gone and "status" in gone[0] else {}
    ctx.expect("a pruned stream answers 410 event_stream_pruned",
               bool(gone) and gone[0].get("status") == 410 and body.get("code") == "event_stream_pruned",
               str(gone)[:200], "R-EVENT-5")
    # At once, not after a wait (issue 22, item 10): the answer comes from the prune record.
    ctx.expect(f"the pruned stream's 410 came at once (bound {PRUNED_ANSWER_S:g} s)",
               answered_s <= PRUNED_ANSWER_S, f"after {answered_s:.2f} s", "R-EVENT-5")
    resumed = read_stream(ctx, api, run_ids[1], dict(ctx.sql("SELECT run_id::text, stream_key FROM runs"
                                                            " WHERE run_id = %s", run_ids[1]))[run_ids[1]],
                          last_event_id="1")
    said = json.loads(resumed[0].get("body") or "{}") if resumed and "status" in resumed[0] else {}
    ctx.expect("a pruned stream asked with Last-Event-ID answers 410 event_stream_pruned too (not 204)",
               bool(resumed) and resumed[0].get("status") == 410 and said.get("code") == "event_stream_pruned",
               str(resumed)[:200], "R-EVENT-5")
    ctx.expect("the pruned run's record stays readable",
               ctx.read_run(api, run_ids[0])["state"] == "cancelled", "", "R-EVENT-5")
    kept = read_stream(ctx, api, live_id, live_key, stop_after=1)
    ctx.expect("a live run's stream is kept", bool(kept) and kept[0].get("event") == "state",
               str(kept)[:200], "R-EVENT-5")
    ctx.cancel_run(api, live_id)
