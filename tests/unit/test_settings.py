"""Settings in one place (issue 15, item 2): one model per process, the documentation
table generated from the models, and a missing or malformed setting that stops the API,
the worker and the one-shot sweep at once with one line naming the variable, exit 64."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qimpl.settings import (
    EXIT_CONFIG,
    AdminSettings,
    ApiSettings,
    ConfigError,
    Settings,
    WorkerSettings,
    load,
    settings_table,
)
from qualify.processes import Deployment

ROOT = Path(__file__).resolve().parents[2]
DSN = "postgresql://qimpl_worker@127.0.0.1:1/qimpl"
BEGIN, END = "<!-- settings-table:begin", "<!-- settings-table:end -->"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment with no qimpl setting at all."""
    for name in list(os.environ):
        if name.startswith(("QIMPL_", "AGENT_", "DURABLE_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_the_documented_table_is_the_generated_one() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    begin = doc.index(BEGIN)
    table = doc[doc.index("\n", begin) + 1:doc.index(END)]
    assert table == settings_table(), "regenerate it: python -m qimpl.settings"


def test_every_variable_of_every_model_is_in_the_table() -> None:
    table = settings_table()
    for var in ("QIMPL_DATABASE_URL", "QIMPL_ADMIN_DATABASE_URL", "QIMPL_API_KEYS", "QIMPL_TOOLS",
                "AGENT_CONCURRENCY_LIMIT", "DURABLE_AGENT_RECONCILE_TENANTS", "QIMPL_METRICS_PORT"):
        assert f"| `{var}` |" in table


@pytest.mark.parametrize(("variables", "code", "variable", "says"), [
    ({}, "setting_missing", "QIMPL_DATABASE_URL", "is not set"),
    ({"QIMPL_DATABASE_URL": "127.0.0.1:5432"}, "setting_invalid", "QIMPL_DATABASE_URL", "PostgreSQL URL"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_PROVIDER_CONFIG": "{steps: 3"}, "setting_invalid",
     "QIMPL_PROVIDER_CONFIG", "not valid JSON"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_PROVIDER_CONFIG": "[1]"}, "setting_invalid",
     "QIMPL_PROVIDER_CONFIG", "JSON object"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_PROVIDER": "my_provider"}, "setting_invalid",
     "QIMPL_PROVIDER", "module:factory"),
    ({"QIMPL_DATABASE_URL": DSN, "DURABLE_AGENT_RECONCILE_TENANTS": "acme"}, "setting_invalid",
     "DURABLE_AGENT_RECONCILE_TENANTS", "not valid JSON"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_HEARTBEAT_TIMEOUT_S": "2s"}, "setting_invalid",
     "QIMPL_HEARTBEAT_TIMEOUT_S", "number"),
    # A tester's QIMPL_TEMPORAL_ADDRESS=nonsense was "cannot reach Temporal" (exit 3).
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_TEMPORAL_ADDRESS": "nonsense"}, "setting_invalid",
     "QIMPL_TEMPORAL_ADDRESS", "host:port"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_TEMPORAL_ADDRESS": "http://t:7233/x"}, "setting_invalid",
     "QIMPL_TEMPORAL_ADDRESS", "host:port"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_TEMPORAL_ADDRESS": "t:70000"}, "setting_invalid",
     "QIMPL_TEMPORAL_ADDRESS", "host:port"),
])
def test_a_bad_setting_names_its_variable_and_an_example(
        env: pytest.MonkeyPatch, variables: dict[str, str], code: str, variable: str, says: str) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load(WorkerSettings)
    err = caught.value
    assert (err.code, err.variable) == (code, variable)
    assert says in err.reason and err.example
    line = json.loads(err.line("worker"))
    assert line["variable"] == variable and variable in line["msg"] and "\n" not in err.line("worker")


def test_each_process_validates_only_what_it_reads(env: pytest.MonkeyPatch) -> None:
    env.setenv("QIMPL_DATABASE_URL", DSN)
    env.setenv("QIMPL_TOOLS_CONFIG", "not json")  # the worker's alone
    assert load(ApiSettings).database_url == DSN
    assert load(Settings).database_url == DSN
    with pytest.raises(ConfigError, match="QIMPL_TOOLS_CONFIG"):
        load(WorkerSettings)


def test_the_harness_environment_loads_unchanged(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every name the harness sets (``Deployment.env``) keeps working."""
    deployment = Deployment(dsn="postgresql://postgres@127.0.0.1:5/q1", temporal_address="127.0.0.1:7",
                            task_queue="q", control_dir=tmp_path, logs_dir=tmp_path,
                            sink_url="http://127.0.0.1:9",
                            extra_env={"DURABLE_AGENT_RECONCILE_TENANTS": '["t-dev"]',
                                       "AGENT_CONCURRENCY_LIMIT": "2"})
    for name, value in deployment.env().items():
        if name.startswith(("QIMPL_", "AGENT_", "DURABLE_")):
            env.setenv(name, value)
    worker = load(WorkerSettings)
    assert worker.provider == "qualify.fakes.synthetic:SyntheticProvider"
    assert worker.provider_config == {"control_dir": str(tmp_path)}
    assert worker.tools_config == {"sink_url": "http://127.0.0.1:9"}
    assert (worker.reconcile_tenants, worker.concurrency_limit, worker.heartbeat_timeout_s) == (["t-dev"], 2, 1.0)
    assert worker.lease == 1.0  # the catalog's lease: the heartbeat timeout (Deployment.lease)
    assert load(ApiSettings).task_queue == "q"


@pytest.mark.req("R-EXEC-13")
def test_the_default_lease_ends_before_temporals_heartbeat_timeout(env: pytest.MonkeyPatch) -> None:
    """With the defaults the takeover watcher, not Temporal's heartbeat timeout, ends the
    attempt of a paused owner, wherever it was paused (``qimpl.takeover.watcher_margin_s``;
    at L = H the bench's paused owner took 3.97 s instead of 2.25 s). Unset, the lease is
    half the heartbeat timeout, whatever that is; set, it is what was set."""
    env.setenv("QIMPL_DATABASE_URL", DSN)
    settings = load(WorkerSettings)
    assert (settings.heartbeat_timeout_s, settings.lease) == (4.0, 2.0)
    assert settings.watcher_margin_s() == pytest.approx(0.4)
    assert settings.watcher_margin_s(poll_s=0.5) <= 0  # the lease is not above 4 polls
    env.setenv("QIMPL_HEARTBEAT_TIMEOUT_S", "10")
    assert load(WorkerSettings).lease == 5.0
    env.setenv("QIMPL_LEASE_S", "10")
    assert load(WorkerSettings).watcher_margin_s() < 0


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("QIMPL_HEARTBEAT_TIMEOUT_S", "inf", "finite"), ("QIMPL_HEARTBEAT_TIMEOUT_S", "nan", "finite"),
    ("QIMPL_HEARTBEAT_TIMEOUT_S", "1e6", "less than or equal to 1200"),
    ("QIMPL_HEARTBEAT_TIMEOUT_S", "1201", "less than or equal to 1200"),
    ("QIMPL_LEASE_S", "nan", "finite"), ("QIMPL_LEASE_S", "601", "less than or equal to 600"),
])
def test_a_timing_that_would_not_fit_is_refused_saying_why(env: pytest.MonkeyPatch, variable: str,
                                                           value: str, says: str) -> None:
    """Unset, the lease is half the heartbeat timeout: the timeout is bounded so that lease
    fits the lease's own bound (its TCP keepalives must fit the kernel's limits); neither
    takes infinity or NaN, and the error says so."""
    env.setenv("QIMPL_DATABASE_URL", DSN)
    env.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable) as refused:
        load(WorkerSettings)
    assert says in str(refused.value)


def test_the_admin_dsn_falls_back_to_the_database_url(env: pytest.MonkeyPatch) -> None:
    env.setenv("QIMPL_DATABASE_URL", DSN)
    assert load(AdminSettings).admin_database_url == DSN
    env.setenv("QIMPL_ADMIN_DATABASE_URL", "postgresql://owner@h/db")
    assert load(AdminSettings).admin_database_url == "postgresql://owner@h/db"


def _start(argv: list[str], **variables: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("QIMPL_", "AGENT_", "DURABLE_"))}
    environ.update(variables, PYTHONPATH=str(ROOT))
    # subprocess.run kills and reaps the child if it outlives the timeout.
    return subprocess.run([sys.executable, *argv], env=environ, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


API = ["-m", "uvicorn", "--factory", "qimpl.api.app:create_app", "--host", "127.0.0.1", "--port", "0"]
WORKER = ["-m", "qimpl.workflows.worker"]


@pytest.mark.parametrize("argv", [API, WORKER], ids=["api", "worker"])
@pytest.mark.parametrize(("variables", "variable"), [
    ({}, "QIMPL_DATABASE_URL"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_PROVIDER_CONFIG": "{nope"}, "QIMPL_PROVIDER_CONFIG"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_PROVIDER": "no_such_module:Factory"}, "QIMPL_PROVIDER"),
    ({"QIMPL_DATABASE_URL": DSN, "QIMPL_PROVIDER": "qimpl.provider:NoSuchFactory"}, "QIMPL_PROVIDER"),
], ids=["no-database-url", "provider-config-not-json", "provider-module-missing", "provider-factory-missing"])
def test_a_process_with_a_bad_setting_stops_at_once_with_one_line(
        argv: list[str], variables: dict[str, str], variable: str) -> None:
    done = _start(argv, **variables)
    assert done.returncode == EXIT_CONFIG, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert json.loads(lines[0])["variable"] == variable
    assert "Traceback" not in done.stderr + done.stdout


def test_the_worker_refuses_tools_that_do_not_load() -> None:
    done = _start(WORKER, QIMPL_DATABASE_URL=DSN, QIMPL_TOOLS="no_such_module:tools")
    assert done.returncode == EXIT_CONFIG and json.loads(done.stderr)["variable"] == "QIMPL_TOOLS"


@pytest.mark.req("R-OPS-4")
@pytest.mark.parametrize(("args", "variables", "says"), [
    ([], {"QIMPL_DATABASE_URL": DSN}, "--tenant"),
    (["--tenant", "t", "--limit", "x"], {"QIMPL_DATABASE_URL": DSN}, "--limit"),
    (["--tenant", "t"], {}, "QIMPL_DATABASE_URL"),
    (["--tenant", "t", "--limit", "101"], {"QIMPL_DATABASE_URL": DSN}, "between 1 and 100"),
    (["--tenant", "t", "--limit", "0"], {"QIMPL_DATABASE_URL": DSN}, "between 1 and 100"),
    (["--tenant", ""], {"QIMPL_DATABASE_URL": DSN}, "--tenant must name a tenant"),
    (["--tenant", "t", "--tenant", " "], {"QIMPL_DATABASE_URL": DSN}, "--tenant must name a tenant"),
], ids=["no-tenant", "bad-limit", "no-database-url", "limit-above-100", "limit-zero", "empty-tenant",
        "blank-tenant"])
def test_the_sweep_calls_a_usage_error_64(args: list[str], variables: dict[str, str], says: str) -> None:
    done = _start(["-m", "qimpl.scripts.agent_runs", *args], **variables)
    assert done.returncode == 64, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["-m", "qimpl.db.migrate"], "QIMPL_ADMIN_DATABASE_URL"),
    (["-m", "qimpl.scripts.api_keys", "grant", "--tenant", "t", "--principal", "p", "--workspace", "w",
      "--grant-token", ""], "--grant-token is empty"),
    (["-m", "qimpl.scripts.api_keys", "create", "--tenant", "t", "--principal", "p", "--key", "short"],
     "--key needs at least 24 characters"),
    (["-m", "qimpl.scripts.api_keys", "create", "--tenant", " ", "--principal", "p"],
     "must not be empty"),
], ids=["migrate-without-dsn", "empty-grant-token", "short-chosen-key", "empty-tenant"])
def test_the_operator_scripts_call_a_usage_error_64(argv: list[str], says: str) -> None:
    done = (_start(argv, QIMPL_DATABASE_URL="") if "api_keys" not in " ".join(argv)
            else _start(argv, QIMPL_DATABASE_URL=DSN))
    assert done.returncode == 64, (done.stdout, done.stderr)
    assert says in done.stderr and "Traceback" not in done.stderr


@pytest.mark.req("R-AUTH-1")
def test_static_keys_have_no_built_in_default_and_must_be_secrets() -> None:
    """No built-in development key; a chosen static key is long, names a tenant and a
    principal, and a known role (issue 13, item 8)."""
    from pydantic import ValidationError

    from qimpl.settings import ApiSettings

    dsn = "postgresql://u@127.0.0.1:1/x"
    assert ApiSettings(database_url=dsn).api_keys == {}
    good = "abcdefghijklmnopqrstuvwx"
    assert ApiSettings(database_url=dsn, auth="static", api_keys={good: {"tenant": "t", "principal": "p"}})
    for keys in ({}, {"dev-key": {"tenant": "t", "principal": "p"}}, {"a" * 30: {"tenant": "t", "principal": "p"}},
                 {good: {"tenant": "", "principal": "p"}},
                 {good: {"tenant": "t", "principal": "p", "role": "root"}}):
        with pytest.raises(ValidationError):
            ApiSettings(database_url=dsn, auth="static", api_keys=keys)


@pytest.mark.req("R-EVENT-6")
@pytest.mark.parametrize(("origin", "ok"), [
    ("https://app.example.com", True), ("http://localhost:8000", True), ("https://app.example.com:8443", True),
    # A browser never sends a scheme's default port: the entry would match no preflight.
    ("https://app.example.com:443", False), ("http://localhost:80", False), ("http://[::1]:80", False),
    ("https://app.example.com/", False), ("*", False),
])
def test_a_cors_origin_is_one_a_browser_sends(env: pytest.MonkeyPatch, origin: str, ok: bool) -> None:
    env.setenv("QIMPL_DATABASE_URL", DSN)
    env.setenv("QIMPL_CORS_ORIGINS", json.dumps([origin]))
    if ok:
        assert load(ApiSettings).cors_origins == [origin]
        return
    with pytest.raises(ConfigError) as caught:
        load(ApiSettings)
    assert caught.value.variable == "QIMPL_CORS_ORIGINS"


def test_each_process_is_shown_the_login_role_it_connects_as(env: pytest.MonkeyPatch) -> None:
    """The one-shot sweep connects as the workers do (docs/operations.md, "The one-shot
    sweep"), but its missing-DSN message showed the API's role ``qimpl_api``; and the
    documented example of the worker's message showed ``qimpl_api`` where it says
    ``qimpl_worker``."""
    env.delenv("QIMPL_DATABASE_URL", raising=False)
    for model, role in ((WorkerSettings, "qimpl_worker"), (Settings, "qimpl_worker"),
                        (ApiSettings, "qimpl_api")):
        with pytest.raises(ConfigError) as caught:
            load(model)
        assert f"postgresql://{role}:" in caught.value.example, model.__name__
    ops = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert "\"msg\": \"worker: QIMPL_DATABASE_URL is not set; for example QIMPL_DATABASE_URL='postgresql://qimpl_worker:" in ops


@pytest.mark.req("R-AUTH-1")
@pytest.mark.parametrize(("tenant", "says"), [("t" * 129, "longer than 128 bytes"), ("t\x07", "control character")])
def test_a_static_keys_tenant_is_bounded_as_api_keys_are(env: pytest.MonkeyPatch, tenant: str, says: str) -> None:
    """A new user's finding: ``api_keys`` refuses a tenant of more than 128 bytes (its
    runs' stream tokens would be refused by the events route) or with a control character,
    and ``QIMPL_API_KEYS`` took one. It is a configuration error too."""
    key = "k-" + "0123456789abcdefghijklmnop"
    env.setenv("QIMPL_DATABASE_URL", DSN)
    env.setenv("QIMPL_AUTH", "static")
    env.setenv("QIMPL_API_KEYS", json.dumps({key: {"tenant": "t" * 128, "principal": "p"}}))
    assert load(ApiSettings).api_keys[key]["tenant"] == "t" * 128
    env.setenv("QIMPL_API_KEYS", json.dumps({key: {"tenant": tenant, "principal": "p"}}))
    with pytest.raises(ConfigError) as caught:
        load(ApiSettings)
    assert caught.value.variable == "QIMPL_API_KEYS" and says in caught.value.reason


@pytest.mark.req("R-EVENT-6")
@pytest.mark.parametrize(("origin", "says"), [
    ("https://App.Example.com", "https://app.example.com"), ("http://LOCALHOST:8000", "http://localhost:8000"),
    ("https://app.example.com ", None), ("https://user@app.example.com", None),
    ("https://app.example.com:abc", None), ("https://app.example.com:99999", None),
    ("https://app.example.com?x=1", None), ("https://app.example.com#top", None), ("https://:8443", None),
])
def test_a_cors_origin_no_browser_sends_is_refused(env: pytest.MonkeyPatch, origin: str, says: str | None) -> None:
    """A new user's finding: ``QIMPL_CORS_ORIGINS='["https://App.Example.com"]'`` was taken,
    and browsers send their origin with the host in lower case (and never with a user,
    a query, a space or a port that is not one): the entry matched no request, and every
    preflight of that page was refused ``cors_preflight_refused`` with nothing at start to
    say why. Like a default port, it is a configuration error naming what to write."""
    env.setenv("QIMPL_DATABASE_URL", DSN)
    env.setenv("QIMPL_CORS_ORIGINS", json.dumps([origin]))
    with pytest.raises(ConfigError) as caught:
        load(ApiSettings)
    assert caught.value.variable == "QIMPL_CORS_ORIGINS"
    if says:
        assert f"write {says}" in caught.value.reason
    for good in ("https://app.example.com", "http://[::1]:8000", "http://127.0.0.1:8000"):
        env.setenv("QIMPL_CORS_ORIGINS", json.dumps([good]))
        assert load(ApiSettings).cors_origins == [good]
