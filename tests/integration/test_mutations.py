"""Break a mechanism of qimpl in a throwaway copy and expect ``qualify`` to fail with a
checker naming the violation (a harness that cannot fail proves nothing)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MUTATIONS = {
    # The retried attempt forgets the last checkpoint and starts again at step 1.
    "skip-checkpoint-restore": (
        "qimpl/workflows/activities.py",
        "checkpoint = await repo.latest_checkpoint(owner.conn, inp.run_id)",
        "checkpoint = None",
        "worker-killed-mid-activity",
        "no provider step repeated after its checkpoint",
    ),
    # The lease session no longer ends while idle inside a transaction (R-EXEC-11).
    "lease-without-idle-in-transaction-timeout": (
        "qimpl/workflows/lease.py",
        'MANDATORY_SETTINGS = ("idle_session_timeout", "idle_in_transaction_session_timeout", "lock_timeout")',
        'MANDATORY_SETTINGS = ("idle_session_timeout", "lock_timeout")',
        "owner-paused-inside-checkpoint-transaction",
        "a new attempt took over within 12 s",
    ),
    # A result the database refuses is retried as if the session were lost: never counted.
    "storage-refusal-not-counted": (
        "qimpl/workflows/activities.py",
        'raise _StepFailed(f"unstored_result:{type(exc).__name__}") from None',
        "raise",
        "unstorable-provider-output",
        "NUL in the answer: failed agent_attempts_exhausted",
    ),
}


@pytest.mark.req("R-Q-5")
@pytest.mark.req("R-EXEC-4")
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_broken_mechanism_fails_qualification(name: str, tmp_path: Path) -> None:
    path, old, new, scenario, checker = MUTATIONS[name]
    copy = tmp_path / "copy"
    for part in ("qimpl", "qualify"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / path
    text = target.read_text()
    assert text.count(old) == 1, f"mutation {name} no longer applies: update it"
    target.write_text(text.replace(old, new))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    proc = subprocess.run(
        [sys.executable, "-m", "qualify.cli", "run", "-s", scenario, "--seed", "3",
         "--reports-dir", str(tmp_path / "reports")],
        cwd=copy, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    (summary_path,) = (tmp_path / "reports").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    (sc,) = summary["scenarios"]
    failed = [c["name"] for c in sc["checks"] if c["ok"] is False]
    assert sc["status"] == "fail" and checker in failed, failed
