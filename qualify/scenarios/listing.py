"""Run listings judged against the database (R-READ-5): what a client and an operator are
shown, page by page and filter by filter, must be exactly what the database holds for
them at that moment, read on its own clock — never another principal's or tenant's run,
never one twice, none missing."""

from __future__ import annotations

from typing import Any

import httpx

from qualify.errors import HarnessError
from qualify.fakes.synthetic import make_prompt
from qualify.procs import wait_until
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.lifecycle import accepted

OWNER, PEER, OPERATOR, OTHER_OPERATOR = "dev-key", "peer-key", "ops-key", "ops-other-key"


def pages(api_url: str, path: str, key: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page of a listing, following ``next_cursor`` (HarnessError on a non-200 or a
    listing that does not end within 50 pages)."""
    out: list[list[dict[str, Any]]] = []
    cursor = None
    while len(out) < 50:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        resp = httpx.get(f"{api_url}{path}", params=query, headers={"Authorization": f"Bearer {key}"},
                         timeout=30)
        if resp.status_code != 200:
            raise HarnessError(f"GET {path} {query}: {resp.status_code} {resp.text[:200]}")
        doc = resp.json()
        out.append(doc["runs"])
        cursor = doc["next_cursor"]
        if cursor is None:
            return out
    raise HarnessError(f"GET {path}: more than 50 pages")


def _ids(listed: list[list[dict[str, Any]]]) -> list[str]:
    return [r["run_id"] for page in listed for r in page]


def _truth(ctx: ScenarioContext, where: str, *params: Any, newest_first: bool = False) -> list[str]:
    """Run ids the database holds under ``where`` (a condition on ``runs``), in the listing's
    order, evaluated now on the database's clock."""
    order = "DESC" if newest_first else "ASC"
    rows = ctx.sql(f"SELECT run_id::text FROM runs WHERE {where} ORDER BY accepted_at {order}, run_id {order}",
                   *params)
    return [r[0] for r in rows]


@scenario(
    "runs-listed",
    title="Client and operator listings against the database: a client's pages (two per "
          "page) are exactly its own runs of the agent, newest first, none twice; a peer "
          "principal sees none of them; an operator's pages (one per page) are its "
          "tenant's runs oldest first, and its filters (state, accepted age, deadline "
          "near) keep exactly what the database's clock says; another tenant's operator "
          "sees none of them",
    requirements=("R-READ-5", "R-AUTH-1", "R-OPS-7"),
)
def runs_listed(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()   # no worker yet: every run stays queued
    url = api.base_url
    old = [accepted(ctx, api, prompt=make_prompt(steps=1, answer=f"old-{i}")) for i in range(2)]
    due = accepted(ctx, api, prompt=make_prompt(steps=1, answer="due"), deadline_seconds=30)
    # Wait on the database's clock until the first runs are over 1.5 s old, then add a fresh one.
    wait_until(lambda: ctx.sql("SELECT clock_timestamp() - min(accepted_at) >= interval '1.5 s' FROM runs")[0][0],
               timeout_s=15, what="the first runs 1.5 s old on the database's clock")
    fresh = accepted(ctx, api, prompt=make_prompt(steps=1, answer="fresh"))
    peer = httpx.post(f"{url}/v1/agents/agent-1/runs", timeout=30,
                      json={"prompt": make_prompt(steps=1, answer="peer"), "durable_temporal": True},
                      headers={"Authorization": f"Bearer {PEER}", "Idempotency-Key": "peer-run"})
    if peer.status_code != 202:
        raise HarnessError(f"the peer's create: {peer.status_code} {peer.text[:200]}")
    ctx.history.record("client", op="create", phase="ok", run_id=peer.json()["run_id"], status=202)
    mine = [*old, due, fresh]

    owner_pages = pages(url, "/v1/agents/agent-1/runs", OWNER, limit=2)
    want = _truth(ctx, "tenant_id = 't-dev' AND principal_id = 'p-dev' AND agent_id = 'agent-1'",
                  newest_first=True)
    ctx.expect("the owner's pages are its runs of the agent, newest first, each once",
               _ids(owner_pages) == want and set(want) == set(mine)
               and all(len(p) <= 2 for p in owner_pages),
               f"listed {_ids(owner_pages)} in {len(owner_pages)} pages; database {want}",
               "R-READ-5", judged=len(want))
    peer_listed = _ids(pages(url, "/v1/agents/agent-1/runs", PEER))
    ctx.expect("the peer principal's listing is its own run, none of the owner's",
               peer_listed == [peer.json()["run_id"]], f"{peer_listed}", "R-READ-5", "R-AUTH-1",
               judged=len(mine))

    ops_pages = pages(url, "/v1/operator/runs", OPERATOR, limit=1)
    tenant_truth = _truth(ctx, "tenant_id = 't-dev'")
    ctx.expect("the operator's pages are its tenant's runs, oldest accepted first, each once",
               _ids(ops_pages) == tenant_truth and all(len(p) == 1 for p in ops_pages),
               f"listed {_ids(ops_pages)}; database {tenant_truth}", "R-READ-5", "R-OPS-7",
               judged=len(tenant_truth))
    filters: list[tuple[str, dict[str, Any], str]] = [
        ("state queued", {"state": "queued"}, "tenant_id = 't-dev' AND state = 'queued'"),
        ("accepted at least 1 s ago", {"accepted_before_s": 1},
         "tenant_id = 't-dev' AND accepted_at <= clock_timestamp() - interval '1 s'"),
        ("deadline within 60 s", {"deadline_within_s": 60},
         "tenant_id = 't-dev' AND deadline_at <= clock_timestamp() + interval '60 s'"
         " AND state NOT IN ('completed', 'failed', 'expired', 'cancelled')"),
    ]
    for name, params, where in filters:
        got = _ids(pages(url, "/v1/operator/runs", OPERATOR, **params))
        truth = _truth(ctx, where)
        ctx.expect(f"operator filter {name}: exactly the database's runs", got == truth and bool(truth),
                   f"listed {got}; database {truth}", "R-READ-5", judged=len(truth))
    aged, near = _truth(ctx, filters[1][2]), _truth(ctx, filters[2][2])
    ctx.expect("the filters had runs on both sides (the old runs aged, the fresh one not; one run due)",
               set(old) <= set(aged) and fresh not in aged and near == [due],
               f"aged {aged}; due {near}", judged=len(mine))
    other_seen = set(_ids(pages(url, "/v1/operator/runs", OTHER_OPERATOR))) & set(tenant_truth)
    ctx.expect("another tenant's operator lists none of them", not other_seen, str(sorted(other_seen)),
               "R-READ-5", "R-OPS-7", judged=len(tenant_truth))

    ctx.processes.worker()
    for run_id in mine:
        ctx.wait_terminal(api, run_id, timeout_s=60)
    wait_until(lambda: ctx.sql("SELECT state = 'completed' FROM runs WHERE run_id = %s", peer.json()["run_id"])[0][0],
               timeout_s=60, what="the peer's run completed")
    done = _ids(pages(url, "/v1/operator/runs", OPERATOR, state="completed"))
    truth = _truth(ctx, "tenant_id = 't-dev' AND state = 'completed'")
    ctx.expect("after the worker ran them, state completed lists exactly the completed runs",
               done == truth and set(mine) <= set(truth), f"listed {done}; database {truth}",
               "R-READ-5", judged=len(truth))
    ctx.figures["runs_listed"] = len(mine) + 1
