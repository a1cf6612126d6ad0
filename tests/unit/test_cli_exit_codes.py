"""The documented exit codes reach the shell (a run that fails must not exit 0)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _qualify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qualify.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.req("R-Q-6")
def test_usage_errors_exit_64() -> None:
    assert _qualify("run", "-s", "no-such-scenario", "--reports-dir", "/tmp/qualify-x").returncode == 64
    assert _qualify("run", "--stack", "bogus").returncode == 64
    assert _qualify("run", "--seed", "abc").returncode == 64
    assert _qualify("run", "--seed", "-5").returncode == 64
    # Refused before anything runs (a tester's --random -1 ran the whole catalog).
    done = _qualify("run", "--random", "-1", "-s", "happy-path", "--reports-dir", "/tmp/qualify-x")
    assert done.returncode == 64 and "--random" in done.stdout + done.stderr
    assert _qualify("repro").returncode == 64
    assert _qualify("run", "-n", "abc").returncode == 64
    done = _qualify("run", "-n", "0", "-s", "happy-path", "--reports-dir", "/tmp/qualify-x")  # was run as -n 1
    assert done.returncode == 64 and "1 or more" in done.stdout + done.stderr
    assert _qualify("repro", "--schedule", "/nonexistent/repro.json").returncode == 64
    done = _qualify("run", "-s", "happy-path", "--stack", "existing", "--reports-dir", "/tmp/qualify-x")
    assert done.returncode == 64 and "--pg-dsn" in done.stdout


def test_console_keeps_bracketed_text() -> None:
    done = _qualify("run", "--stack", "testcontainers", "--reports-dir", "/tmp/qualify-x")
    # without the extra the hint names it, and rich must not eat "[containers]" as markup;
    # with it, the message is about the Docker daemon
    assert "[containers]" in done.stdout or "Docker" in done.stdout, done.stdout


def test_list_exits_0_and_help_names_the_codes() -> None:
    done = _qualify("list")
    assert done.returncode == 0 and "happy-path" in done.stdout
