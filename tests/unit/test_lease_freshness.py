"""When an owner must prove its lease again before a provider or tool call (R-EXEC-11)."""

from __future__ import annotations

import pytest

from qimpl.db.owner import lease_unproven


@pytest.mark.req("R-EXEC-11")
def test_a_lease_is_proven_again_after_half_of_it() -> None:
    assert not lease_unproven(10.0, 10.0, 2.0)
    assert not lease_unproven(10.0, 10.999, 2.0)
    assert lease_unproven(10.0, 11.0, 2.0)
    # A stop longer than the lease: certainly.
    assert lease_unproven(10.0, 15.0, 2.0)
