"""Break a mechanism of qimpl in a throwaway copy and expect ``qualify`` to fail with a
checker naming the violation (a harness that cannot fail proves nothing). CI runs the
catalog's subset here; ``qualify selftest`` runs it whole (R-Q-9). The subset's
scenarios first pass on the unmutated code with the same seed (the baseline): a mutant
"caught" by a scenario that fails anyway proves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from qualify.mutants import CATALOG, CI_SUBSET
from qualify.selftest import _run_one, baseline

SEED = 3
_BY_NAME = {m.name: m for m in CATALOG}


@pytest.fixture(scope="module")
def unmutated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, str]]:
    scenarios = sorted({_BY_NAME[n].scenario for n in CI_SUBSET})
    return baseline(scenarios, seeds=[SEED], work=tmp_path_factory.mktemp("baseline"))


@pytest.mark.req("R-Q-5", "R-Q-9")
@pytest.mark.parametrize("name", CI_SUBSET)
def test_a_broken_mechanism_fails_qualification(name: str, tmp_path: Path,
                                                unmutated: dict[str, dict[int, str]]) -> None:
    mutant = _BY_NAME[name]
    assert unmutated[mutant.scenario] == {SEED: "pass"}, f"{mutant.scenario} fails unmutated: proves nothing"
    result = _run_one(mutant, seed=SEED, work=tmp_path)
    assert result["caught"], result
