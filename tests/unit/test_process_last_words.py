"""A process that exits before it is ready says why in the harness's error (a tester's
``qualify up`` printed only "process exited with 64 before ready", the reason being in a
log file its temporary directory then removed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from qualify.errors import HarnessError
from qualify.processes import ManagedProcess


@pytest.mark.req("R-Q-6")
def test_a_process_that_dies_before_ready_says_why(tmp_path: Path) -> None:
    log = tmp_path / "worker-1.log"
    log.write_text(json.dumps({"msg": "an earlier start's line"}) + "\n")
    line = json.dumps({"msg": "worker: QIMPL_LEASE_S is invalid: a number"})
    proc = ManagedProcess(name="worker-1", kind="worker", log_path=log, env={},
                          argv=[sys.executable, "-c", f"print({line!r}); raise SystemExit(64)"])
    proc.spawn()
    with pytest.raises(HarnessError, match=r"exited with 64 before ready: worker: QIMPL_LEASE_S is invalid"):
        proc.wait_ready()
    assert proc.last_words() == "worker: QIMPL_LEASE_S is invalid: a number"
