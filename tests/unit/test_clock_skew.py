"""The skewed-clock fault's mechanism (R-Q-10): libfaketime moves a child's wall clock by
the offset asked, and the harness's recorders inside it still read the host's clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from qualify.errors import HarnessError
from qualify.fakes.clock import true_time


def test_true_time_is_the_wall_clock_without_a_preload() -> None:
    assert abs(true_time() - time.time()) < 0.5


@pytest.mark.req("R-Q-10")
@pytest.mark.parametrize("offset", [300, -300])
def test_a_skewed_child_sees_the_offset_and_its_recorder_does_not(offset: int) -> None:
    from qualify.processes import faketime_env

    try:
        env = faketime_env(offset)
    except HarnessError:
        pytest.skip("libfaketime is not installed (a dependency of qualify)")
    code = ("import json, time; from qualify.fakes.clock import true_time;"
            " print(json.dumps({'wall': time.time(), 'true': true_time(), 'mono': time.monotonic()}))")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    after = time.time()
    doc = json.loads(out.stdout)
    assert before - 1 + offset <= doc["wall"] <= after + 1 + offset
    assert before - 1 <= doc["true"] <= after + 1
    assert abs(doc["mono"] - time.monotonic()) < 60  # monotonic clocks are left alone


def test_a_killed_skewed_child_leaves_libfaketimes_shm_and_the_harness_removes_it() -> None:
    """libfaketime removes its ``/dev/shm`` segment and semaphore at a clean exit only; the
    harness SIGKILLs skewed workers, so ``ManagedProcess.stop`` removes them by pid."""
    from pathlib import Path

    from qualify.processes import _remove_faketime_shm, faketime_env
    from qualify.procs import wait_until

    try:
        env = faketime_env(300)
    except HarnessError:
        pytest.skip("libfaketime is not installed (a dependency of qualify)")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.time(); time.sleep(60)"],
                            env={**os.environ, **env})
    shm = Path("/dev/shm", f"faketime_shm_{proc.pid}")
    try:
        wait_until(shm.exists, timeout_s=30, what="libfaketime's shm")
    finally:
        proc.kill()
        proc.wait()
    assert shm.exists()  # the leak: a killed process never cleans up
    _remove_faketime_shm([proc.pid])
    assert not shm.exists()
    assert not Path("/dev/shm", f"sem.faketime_sem_{proc.pid}").exists()
