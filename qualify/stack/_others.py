"""Stacks the harness did not boot itself, or booted in containers (R-Q-1).

- ``existing``: a deployment given by ``--pg-dsn`` (a role that may create databases) and
  ``--temporal-address``. The harness still starts its own API and worker processes, but
  faults that need control of PostgreSQL or Temporal are refused.
- Both register the run's Temporal search attributes in the ``default`` namespace (as a
  deploy does; ``qimpl.workflows.search_attributes``): the harness's workers check them.
- ``testcontainers``: PostgreSQL and the Temporal dev server in Docker containers; exits
  with a clear message when no Docker daemon is reachable.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

from qualify.errors import HarnessError, UsageError
from qualify.procs import wait_until
from qualify.stack._embedded import TEMPLATE_DB, StackInfo, _build_template, _harden, _schema_key
from qualify.stack.temporal import register_search_attributes

__all__ = ["ExistingStack", "TestcontainersStack"]


class _DsnStack:
    """Shared by stacks that reach PostgreSQL through a superuser-ish DSN."""

    kind = "existing"
    controls_platform = False
    postgres: Any = None
    temporal: Any = None

    def __init__(self) -> None:
        self.info: StackInfo | None = None
        self._dsn = ""
        self._template = ""
        self._created: list[str] = []

    def _prepare_template(self, dsn: str) -> None:
        self._dsn = dsn
        self._template = f"{TEMPLATE_DB}_{_schema_key()[:10]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  (self._template,)).fetchone()
        if not exists:
            _build_template(dsn, name=self._template)

    def create_database(self, name: str | None = None) -> str:
        name = name or f"q_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"')
        self._created.append(name)
        _harden(self._dsn.rsplit("/", 1)[0] + f"/{name}")
        return self._dsn.rsplit("/", 1)[0] + f"/{name}"

    def default_timers_address(self) -> str:
        """Its Temporal server, whatever its timers are: the harness did not tune it."""
        assert self.info is not None
        return self.info.temporal_address

    def dynamic_config_at(self, address: str) -> dict[str, str] | None:
        """Nothing the harness set: the server at its address runs as its operator made it."""
        assert self.info is not None
        return {} if address == self.info.temporal_address else None

    def _versions(self) -> tuple[str, str]:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return (str(row[0]) if row else "unknown"), "unknown (not started by the harness)"


class ExistingStack(_DsnStack):
    def __init__(self, *, pg_dsn: str, temporal_address: str) -> None:
        super().__init__()
        if not pg_dsn or not temporal_address:
            raise UsageError("--stack existing needs --pg-dsn and --temporal-address")
        self.pg_dsn = pg_dsn
        self.temporal_address = temporal_address

    def start(self) -> StackInfo:
        t0 = time.monotonic()
        try:
            self._prepare_template(self.pg_dsn)
        except psycopg.Error as exc:
            raise HarnessError(f"cannot prepare a template database on --pg-dsn: {exc}") from exc
        pg_version, temporal_version = self._versions()
        register_search_attributes(self.temporal_address)
        self.info = StackInfo(kind="existing", postgres_version=pg_version,
                              temporal_version=temporal_version, boot_s=round(time.monotonic() - t0, 3),
                              pg_dsn=self.pg_dsn, temporal_address=self.temporal_address)
        return self.info

    def stop(self) -> None:
        """Drop the databases this run created (never the template or anything else)."""
        if not self._dsn or not self._created:
            return
        try:
            with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
                for name in self._created:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error as exc:
            raise HarnessError(f"could not drop this run's databases: {type(exc).__name__}") from exc
        self._created.clear()


def _registered(address: str) -> bool:
    """The container's server answered and has the run's search attributes."""
    try:
        register_search_attributes(address)
    except HarnessError:
        return False
    return True


class TestcontainersStack(_DsnStack):
    kind = "testcontainers"
    __test__ = False  # not a pytest class

    POSTGRES_IMAGE = "postgres:16"
    TEMPORAL_IMAGE = "temporalio/temporal:1.4.1"

    def __init__(self) -> None:
        super().__init__()
        self._containers: list[Any] = []

    def start(self) -> StackInfo:
        try:
            import docker
            from testcontainers.core.container import DockerContainer
            from testcontainers.postgres import PostgresContainer
        except ImportError as exc:
            raise HarnessError("--stack testcontainers needs: pip install -e '.[containers]'") from exc
        try:
            docker.from_env().ping()
        except Exception as exc:
            raise HarnessError(f"--stack testcontainers needs a running Docker daemon ({type(exc).__name__});"
                               " use --stack embedded instead") from exc
        t0 = time.monotonic()
        pg = PostgresContainer(self.POSTGRES_IMAGE, username="postgres", password="postgres")
        pg.start()
        self._containers.append(pg)
        temporal = (DockerContainer(self.TEMPORAL_IMAGE)
                    .with_command("server start-dev --ip 0.0.0.0 --headless").with_exposed_ports(7233))
        temporal.start()
        self._containers.append(temporal)
        dsn = pg.get_connection_url().replace("postgresql+psycopg2://", "postgresql://")
        self._prepare_template(dsn)
        address = f"{temporal.get_container_host_ip()}:{temporal.get_exposed_port(7233)}"
        pg_version, _ = self._versions()
        wait_until(lambda: _registered(address), timeout_s=60, what="temporal container",
                   interval_s=0.5)
        self.info = StackInfo(kind="testcontainers", postgres_version=pg_version,
                              temporal_version=self.TEMPORAL_IMAGE, boot_s=round(time.monotonic() - t0, 3),
                              pg_dsn=dsn, temporal_address=address)
        return self.info

    def stop(self) -> None:
        for c in reversed(self._containers):
            try:
                c.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass
        self._containers.clear()

