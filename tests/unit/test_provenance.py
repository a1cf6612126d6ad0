"""The sign-off's provenance names the code that ran (R-Q-6)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import qualify
from qualify.provenance import git_sha, provenance


@pytest.mark.req("R-Q-6")
def test_the_git_sha_is_the_codes_not_the_working_directorys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's finding: ``qualify run`` took the sha of the directory it was started
    in: run from another git checkout, the report (and its directory's name) claimed that
    checkout's commit for the code under test, and outside any checkout it said
    ``unknown``. It is the commit of the tree that holds the running ``qualify``."""
    code = Path(qualify.__file__).resolve().parent
    expected = git_sha(code)
    if expected[0] == "unknown":
        pytest.skip("qualify is not running from a git checkout")
    other = tmp_path / "other"
    other.mkdir()
    run = {"cwd": other, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **run)  # type: ignore[call-overload]
    subprocess.run(["git", "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q", "--allow-empty", "-m", "x"],
                   **run)  # type: ignore[call-overload]
    monkeypatch.chdir(other)
    assert git_sha() == expected
    assert (provenance()["git_sha"], provenance()["git_dirty"]) == expected
    monkeypatch.chdir(tmp_path)  # not a checkout at all
    assert git_sha()[0] == expected[0]
