"""The benchmark's child processes: one that never says it is ready is reaped all the same."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from bench.env import Subprocess
from qualify.errors import HarnessError


def test_a_child_that_is_never_ready_is_reaped(tmp_path: Path) -> None:
    child = Subprocess([sys.executable, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "child.log",
                       ready_line="never printed", ready_timeout_s=0.5)
    with pytest.raises(HarnessError), child:
        pytest.fail("entered a child that was never ready")
    assert child.proc is not None and child.proc.poll() is not None
    assert not psutil.pid_exists(child.proc.pid)
