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
    assert _qualify("repro").returncode == 64


def test_list_exits_0_and_help_names_the_codes() -> None:
    done = _qualify("list")
    assert done.returncode == 0 and "happy-path" in done.stdout
