"""Security of the API surface (issue 13): what an anonymous caller, a client key and an
operator key of each tenant get from ``/metrics`` (R-OPS-7), and a same-key replay after
the principal's workspace grant was revoked (R-CREATE-2, R-AUTH-2)."""

from __future__ import annotations

import re

import httpx

from qualify import http
from qualify.fakes.synthetic import make_prompt
from qualify.processes import ManagedProcess
from qualify.scenarios.base import ScenarioContext, scenario
from qualify.scenarios.receipts import receipt_diff

#: (client key, its tenant, an operator key of that tenant), as provisioned by the stack.
TENANTS = (("dev-key", "t-dev", "ops-key"), ("other-key", "t-other", "ops-other-key"))


def _metrics(api: ManagedProcess, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http.get(f"{api.base_url}/metrics", headers=headers, timeout=15)


def _tenants_named(text: str) -> set[str]:
    return set(re.findall(r'tenant="([^"]*)"', text))


@scenario(
    "metrics-need-an-operator",
    title="/metrics with runs in two tenants (one and two): anonymous 401 and a client key 403, "
          "neither naming a tenant; each tenant's operator key sees its own tenant's runs, counted, "
          "and never the other tenant's name",
    requirements=("R-OPS-7", "R-OPS-6", "R-AUTH-4"),
)
def metrics_need_an_operator(ctx: ScenarioContext) -> None:
    api = ctx.processes.api()
    created: list[tuple[str, str]] = []
    # Each tenant its own number of runs (1, 2, ...): a scrape that counted another
    # tenant's runs under its own label would show the other's number.
    runs_of = {tenant: i + 1 for i, (_, tenant, _) in enumerate(TENANTS)}
    for client_key, tenant, _ in TENANTS:
        for n in range(runs_of[tenant]):
            resp = http.post(f"{api.base_url}/v1/agents/agent-1/runs", timeout=15,
                              json={"prompt": make_prompt(steps=1), "durable_temporal": True},
                              headers={"Authorization": f"Bearer {client_key}",
                                       "Idempotency-Key": f"metrics-{tenant}-{n}"})
            # No worker: the run stays queued (or accepted), enough to be counted.
            ctx.expect(f"a run of {tenant} is accepted", resp.status_code in (202, 503),
                       f"{resp.status_code} {resp.text[:120]}")
            doc = resp.json()
            created.append((client_key, doc.get("run_id") or doc["receipt"]["run_id"]))
    anonymous = _metrics(api, None)
    ctx.expect("anonymous /metrics is 401 unauthenticated",
               anonymous.status_code == 401 and anonymous.json().get("code") == "unauthenticated",
               f"{anonymous.status_code} {anonymous.text[:120]}", "R-OPS-7")
    for client_key, tenant, _ in TENANTS:
        client = _metrics(api, client_key)
        ctx.expect(f"a client key of {tenant}: 403 operator_credential_required",
                   client.status_code == 403
                   and client.json().get("code") == "operator_credential_required",
                   f"{client.status_code} {client.text[:120]}", "R-OPS-7")
    for leaked in (anonymous, *(_metrics(api, k) for k, _, _ in TENANTS)):
        ctx.expect("a refused scrape names no tenant and no run metric",
                   not _tenants_named(leaked.text) and "qimpl_runs" not in leaked.text
                   and not any(t in leaked.text for _, t, _ in TENANTS),
                   leaked.text[:120], "R-OPS-7")
    for _, tenant, operator_key in TENANTS:
        scrape = _metrics(api, operator_key)
        named = _tenants_named(scrape.text)
        counted = re.findall(rf'qimpl_runs{{state="[a-z_]+",tenant="{tenant}"}} ([0-9.e+]+)', scrape.text)
        ctx.expect(f"{tenant}'s operator: 200 with its own runs counted, and only them",
                   scrape.status_code == 200 and sum(float(n) for n in counted) == runs_of[tenant],
                   f"{scrape.status_code} {counted}; {runs_of[tenant]} created", "R-OPS-6", "R-OPS-7")
        ctx.expect(f"{tenant}'s operator sees only its own tenant's labels",
                   named == {tenant}, f"tenants named: {sorted(named)}", "R-OPS-7", "R-AUTH-4")
    ctx.figures["tenants_in_anonymous_scrape"] = len(_tenants_named(anonymous.text))
    for client_key, run_id in created:  # every accepted run ends
        http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/cancel", timeout=15,
                   headers={"Authorization": f"Bearer {client_key}"}).raise_for_status()


@scenario(
    "replay-after-revoke",
    title="A durable run accepted under key K, then the principal's workspace grant revoked: "
          "the same request with K returns the original receipt (202, replayed); a new key "
          "is 403 workspace_access_denied and a resume 403 workspace_access_revoked",
    requirements=("R-CREATE-2", "R-AUTH-2"),
)
def replay_after_revoke(ctx: ScenarioContext) -> None:
    import psycopg

    from qimpl.db import admin

    api = ctx.processes.api()
    ctx.processes.worker()
    prompt = make_prompt(steps=2, park={"step": 1, "kind": "input"})
    key = f"revoke-{ctx.rng.randrange(10**9)}"
    first = ctx.create_run(api, prompt=prompt, key=key)
    if first is None or first.status_code != 202:
        ctx.expect("the first request is accepted", False,
                   "unknown" if first is None else f"{first.status_code} {first.text[:120]}")
        return
    run_id = first.json()["run_id"]
    ctx.wait_state(api, run_id, "awaiting_input")
    with psycopg.connect(ctx.deployment.dsn, autocommit=True) as conn:  # as an operator
        admin.revoke_workspace(conn, tenant_id="t-dev", principal_id="p-dev", workspace_id="default")
    again = ctx.create_run(api, prompt=prompt, key=key)
    ctx.expect("the same key after the revoke: 202 Idempotent-Replayed",
               again is not None and again.status_code == 202
               and again.headers.get("Idempotent-Replayed") == "true",
               "unknown" if again is None else f"{again.status_code} {again.text[:120]}",
               "R-CREATE-2")
    if again is not None and again.status_code == 202:
        ctx.expect("the replay is the original receipt, whole",
                   not receipt_diff(first.json(), again.json()), str(receipt_diff(first.json(), again.json())),
                   "R-CREATE-2")
    fresh = ctx.create_run(api, prompt=prompt, key=f"{key}-new")
    ctx.expect("a new key after the revoke: 403 workspace_access_denied (new work is authorised)",
               fresh is not None and fresh.status_code == 403
               and fresh.json().get("code") == "workspace_access_denied",
               "unknown" if fresh is None else f"{fresh.status_code} {fresh.text[:120]}", "R-AUTH-2")
    before = ctx.sql("SELECT state, generation, row_version FROM runs WHERE run_id = %s", run_id)[0]
    resumed = http.post(f"{api.base_url}/v1/agents/agent-1/runs/{run_id}/resume", timeout=15,
                         json={"additional_prompt": "go on"},
                         headers={"Authorization": "Bearer dev-key", "Idempotency-Key": f"{key}-r"})
    after = ctx.sql("SELECT state, generation, row_version FROM runs WHERE run_id = %s", run_id)[0]
    ctx.expect("a resume after the revoke: 403 workspace_access_revoked, and the run untouched",
               resumed.status_code == 403 and resumed.json().get("code") == "workspace_access_revoked"
               and tuple(after) == tuple(before),
               f"{resumed.status_code} {resumed.text[:120]}; run {tuple(before)} -> {tuple(after)}", "R-AUTH-2")
    runs = ctx.sql("SELECT count(*) FROM runs")[0][0]
    ctx.expect("exactly one run", runs == 1, f"{runs} runs", "R-CREATE-2")
    ctx.cancel_run(api, run_id)
