"""The API under faults: the response to a create is lost because the API dies."""

from __future__ import annotations

import json
import time

from qimpl.lifecycle import workflow_id
from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.receipts import receipt_against_the_run

AFTER_ACCEPT = "api.after_acceptance_commit"
AFTER_DISPATCH = "api.after_dispatch"


def _lost_response(ctx: ScenarioContext, point: str) -> None:
    # No worker until the retry has been answered: a worker would claim the run as soon as
    # its workflow starts, and the retry would then find it queued and dispatch nothing.
    fast = {"QIMPL_DISPATCH_TIMEOUT_S": "2"}  # an unanswered key stops being "in flight" sooner
    key = f"lost-response-{ctx.rng.randrange(10**9)}"
    prompt = make_prompt(steps=2, answer="once")
    evidence = ctx.create_on_dying_api(point, name="api-1", prompt=prompt, key=key, **fast)
    if point == AFTER_ACCEPT:
        # R-CREATE-4: what the acceptance transaction committed before the API died (no
        # process touches the run until api-2 answers the retry): the run accepted, its
        # dispatch identity and its key's record, and nothing dispatched yet.
        died_with = str(evidence["context"].get("run_id"))
        committed = ctx.sql(
            "SELECT r.state, r.workflow_id, r.dispatch_confirmed_at IS NULL, i.run_id::text"
            " FROM runs r LEFT JOIN idempotency_records i ON i.key = %s AND i.run_id = r.run_id"
            " WHERE r.run_id = %s", key, died_with)
        ctx.expect("at the crash the run was committed accepted with its workflow id and its key's "
                   "record, its dispatch unconfirmed",
                   committed == [("accepted", workflow_id(died_with, 1), True, died_with)],
                   str(committed), "R-CREATE-4")
    api = ctx.processes.api("api-2", **fast)
    retry = ctx.create_run(api, prompt=prompt, key=key)
    deadline = time.monotonic() + 20
    while retry is not None and retry.status_code == 409 and time.monotonic() < deadline:
        # The first request never answered: the key is "in flight" until its lease ends.
        ctx.expect("while the first request may still be in flight: 409 with Retry-After",
                   retry.json().get("code") == "idempotency_key_in_flight"
                   and "retry-after" in retry.headers, retry.text[:200], "R-CREATE-2")
        time.sleep(min(float(retry.headers.get("retry-after", "1")), 2.0))
        retry = ctx.create_run(api, prompt=prompt, key=key)
    if retry is None:
        raise HarnessError("the retry's outcome is unknown")
    ctx.expect("the retry with the same key gets 202 and Idempotent-Replayed",
               retry.status_code == 202 and retry.headers.get("Idempotent-Replayed") == "true",
               f"{retry.status_code} {dict(retry.headers).get('idempotent-replayed')}", "R-CREATE-2")
    run_id = retry.json()["run_id"]
    ctx.expect("the receipt names the run committed before the crash",
               run_id == evidence["context"].get("run_id"), run_id, "R-CREATE-4")
    rows = ctx.sql("SELECT run_id::text, stream_key, extract(epoch FROM deadline_at)::float8"
                   " FROM runs WHERE run_id = %s", run_id)
    row = dict(zip(("run_id", "stream_key", "deadline_t"), rows[0], strict=True)) if rows else {}
    differ = receipt_against_the_run(retry.json(), row) if row else {"run": ("missing", run_id)}
    # R-CREATE-3: a 202 says queued once the dispatch is confirmed (the retry confirmed it).
    ctx.expect("the replayed receipt is the run's own (stream key, deadline) and says queued",
               not differ and retry.json().get("state") == "queued",
               f"differs {differ}; state {retry.json().get('state')}", "R-CREATE-2", "R-CREATE-3")
    if point == AFTER_DISPATCH:
        # The branch this scenario is for: the retry's dispatch met Temporal's "already
        # started" and counted it as confirmation (evidence: the API's own log line).
        said = [json.loads(line) for line in api.log_path.read_text(errors="replace").splitlines()
                if '"dispatch.already_started"' in line]
        ctx.expect("the retry's dispatch found the workflow already started and confirmed it",
                   any(d.get("run_id") == run_id for d in said), f"{len(said)} log lines", "R-CREATE-5")
    ctx.processes.worker()
    run = ctx.wait_terminal(api, run_id)
    ctx.expect("run completed", run["state"] == "completed", run["state"])
    runs = ctx.sql("SELECT count(*) FROM runs")[0][0]
    ctx.expect("exactly one run", runs == 1, f"{runs} runs", "R-CREATE-2")
    result = ctx.workflow_result(workflow_id(run_id, 1))
    ctx.expect("exactly one workflow: generation 1 completed, no other generation",
               result.get("state") == "completed" and run["generation"] == 1,
               f"workflow g1: {result.get('state')}; run generation {run['generation']}", "R-CREATE-5")


@scenario(
    "lost-response-after-acceptance",
    exec_because="the API's entry point SIGKILLed at its acceptance commit", exec_kinds=("api",),
    title="SIGKILL the API after the acceptance commit, before dispatch; the client retries "
          "with the same key: same receipt, one run, one workflow",
    requirements=("R-CREATE-2", "R-CREATE-4", "R-CREATE-5", "R-Q-4"),
    faults=(f"sigkill at {AFTER_ACCEPT}",),
    crash_points=(AFTER_ACCEPT,),
)
def lost_response_after_acceptance(ctx: ScenarioContext) -> None:
    _lost_response(ctx, AFTER_ACCEPT)


@scenario(
    "lost-response-after-dispatch",
    title="SIGKILL the API after Temporal accepted the workflow, before `queued` is committed; "
          "the retry counts 'already started' as confirmation",
    requirements=("R-CREATE-2", "R-CREATE-5", "R-Q-4"),
    faults=(f"sigkill at {AFTER_DISPATCH}",),
    crash_points=(AFTER_DISPATCH,),
)
def lost_response_after_dispatch(ctx: ScenarioContext) -> None:
    _lost_response(ctx, AFTER_DISPATCH)
