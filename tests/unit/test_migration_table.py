import importlib.util
from pathlib import Path

import pytest

import qimpl.db.migrate as migrate
from qimpl.lifecycle import TRANSITIONS, RunState


def _migration():  # type: ignore[no-untyped-def]
    path = Path(migrate.__file__).parent / "migrations" / "versions" / f"{migrate.HEAD}.py"
    spec = importlib.util.spec_from_file_location("mig", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.req("R-STATE-1")
def test_sql_transition_table_mirrors_the_pure_model() -> None:
    mod = _migration()
    assert {(RunState(a), RunState(b)) for a, b in mod.ALLOWED} == set(TRANSITIONS)
    assert len(mod.ALLOWED) == len(set(mod.ALLOWED))


@pytest.mark.req("R-STATE-2")
def test_sql_states_are_the_model_states() -> None:
    assert set(_migration().STATES) == {s.value for s in RunState}
