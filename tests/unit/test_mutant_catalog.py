"""The self-test's catalog stays applicable (R-Q-9): every patch applies exactly once to
the code as it is, and every mutant names a registered scenario."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.errors import UsageError
from qualify.mutants import CATALOG, CI_SUBSET, Mutant, Patch
from qualify.scenarios import REGISTRY
from qualify.selftest import apply_mutant


@pytest.mark.req("R-Q-9")
@pytest.mark.parametrize("mutant", CATALOG, ids=lambda m: m.name)
def test_every_mutant_applies_and_names_a_scenario(mutant: Mutant, tmp_path: Path) -> None:
    apply_mutant(mutant, tmp_path / "copy")
    assert mutant.scenario in REGISTRY
    for patch in mutant.patches:
        assert patch.new in (tmp_path / "copy" / patch.path).read_text()


@pytest.mark.req("R-Q-9")
def test_a_stale_mutant_is_refused(tmp_path: Path) -> None:
    stale = Mutant("stale", "none", (Patch("qimpl/tools.py", "no such text", "x"),), "happy-path", "x")
    with pytest.raises(UsageError):
        apply_mutant(stale, tmp_path / "copy")


@pytest.mark.req("R-Q-9")
def test_names_are_unique_and_the_ci_subset_is_in_the_catalog() -> None:
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names)) and set(CI_SUBSET) <= set(names)
