"""Break a mechanism of qimpl in a throwaway copy and expect ``qualify`` to fail with a
checker naming the violation (a harness that cannot fail proves nothing). CI runs the
catalog's subset here; ``qualify selftest`` runs it whole (R-Q-9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.mutants import CATALOG, CI_SUBSET
from qualify.selftest import _run_one


@pytest.mark.req("R-Q-5", "R-Q-9")
@pytest.mark.parametrize("name", CI_SUBSET)
def test_a_broken_mechanism_fails_qualification(name: str, tmp_path: Path) -> None:
    (mutant,) = [m for m in CATALOG if m.name == name]
    result = _run_one(mutant, seed=3, work=tmp_path)
    assert result["caught"], result
