import re
from pathlib import Path

import pytest

from qualify.scenarios import REGISTRY
from qualify.spec_ids import REQUIREMENTS

SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec" / "durable-runs.md"


@pytest.mark.req("R-Q-6")
def test_requirement_list_matches_the_spec() -> None:
    if not SPEC.exists():
        pytest.skip("the spec is not beside this clone")
    defined = re.findall(r"^- \*\*(R-[A-Z0-9]+-\d+)\*\*", SPEC.read_text(), flags=re.M)
    assert tuple(defined) == REQUIREMENTS


def test_scenarios_cite_only_real_requirements() -> None:
    cited = {r for sc in REGISTRY.values() for r in sc.requirements}
    assert cited <= set(REQUIREMENTS), cited - set(REQUIREMENTS)
