"""The self-test's catalog stays applicable (R-Q-9): every patch applies exactly once to
the code as it is, and every mutant names a registered scenario."""

from __future__ import annotations

import re
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
    stale = Mutant("stale", "none", (Patch("qimpl/tool_journal/seam.py", "no such text", "x"),), "happy-path", "x")
    with pytest.raises(UsageError):
        apply_mutant(stale, tmp_path / "copy")


@pytest.mark.req("R-Q-9")
def test_names_are_unique_and_the_ci_subset_is_in_the_catalog() -> None:
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names)) and set(CI_SUBSET) <= set(names)


_VERSIONS = Path(__file__).resolve().parents[2] / "qimpl" / "db" / "migrations" / "versions"
#: A definition in SQL text (a function, a trigger, a table's policy), or one a migration
#: composes in Python from a ``("name(signature)", returns, body)`` tuple (the hardening
#: revision's definers).
_DEFINES = re.compile(r"CREATE (?:OR REPLACE )?(FUNCTION|TRIGGER) (?:public\.)?(\w+)"
                      r"|CREATE POLICY (\w+ ON) (?:public\.)?(\w+)|\(\"(\w+)\(")


def _defined_at(text: str, at: int) -> tuple[str, str] | None:
    """The definition the position ``at`` of a migration is in: its name, and a pattern
    that finds it defined again in a later revision."""
    found = list(_DEFINES.finditer(text, 0, at))
    if not found:
        return None
    m = found[-1]
    if m.group(3):
        name = f"{m.group(3)} {m.group(4)}"
        return name, rf"CREATE POLICY {m.group(3)} (?:public\.)?{m.group(4)}\b"
    if m.group(1) == "TRIGGER":  # a trigger may share its function's name: only a trigger redefines it
        return f"trigger {m.group(2)}", rf"CREATE TRIGGER {m.group(2)}\b"
    name = m.group(2) or m.group(5)
    return name, rf"CREATE (?:OR REPLACE )?FUNCTION (?:public\.)?{name}\b|\(\"{name}\("


@pytest.mark.req("R-Q-9")
@pytest.mark.parametrize("mutant", [m for m in CATALOG if any("db/migrations" in p.path for p in m.patches)],
                         ids=lambda m: m.name)
def test_a_migration_patch_hits_the_definition_in_effect(mutant: Mutant) -> None:
    """A patch to a migration must break the definition the head schema runs: no later
    revision may define the patched function or trigger again, or the patch applies and
    changes nothing (three mutants of the catalog did, once the guard was rewritten whole)."""
    for patch in mutant.patches:
        if "db/migrations" not in patch.path:
            continue
        path = Path(patch.path).name
        text = (_VERSIONS / path).read_text()
        # The definition the patch's text ends in: its own, when it starts one (a trigger).
        at = text.index(patch.old, text.index(patch.after) if patch.after else 0) + len(patch.old)
        defined = _defined_at(text, at)
        later_revisions = [v for v in sorted(_VERSIONS.glob("*.py")) if v.name > path]
        if defined is None:  # SQL composed from pieces in Python: the patched text must not recur later
            name, later = None, [v.name for v in later_revisions if patch.old in v.read_text()]
        else:
            name, again = defined
            later = [v.name for v in later_revisions if re.search(again, v.read_text())]
        assert not later, f"{mutant.name}: {name or 'the text'} patched in {path} is defined again in {later}"


def _check_names() -> tuple[dict[str, set[str]], set[str]]:
    """The checks each scenario made in the gate fixture's full run (those that cite a
    requirement), and every string literal of the scenarios and checkers (a check name
    written whole, adjacent literals joined as Python joins them)."""
    import ast
    import json

    root = Path(__file__).resolve().parents[2]
    doc = json.loads((root / "tests" / "data" / "gate_summary.json").read_text())
    made = {sc["id"]: {c["name"] for c in sc["checks"]} for sc in doc["scenarios"]}
    literals = {node.value for folder in ("qualify/scenarios", "qualify/checkers")
                for path in (root / folder).glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return made, literals


@pytest.mark.req("R-Q-9")
def test_every_mutant_names_a_check_its_scenario_makes() -> None:
    """A renamed check left its mutant naming the old one: the self-test then reported the
    mutant MISSED although the renamed check caught it (deadline-metric-misses-expiries,
    2026-12-06). Each mutant's check is one its scenario made in the fixture's run, or a
    name written whole in the harness's code."""
    made, literals = _check_names()
    stale = [(m.name, m.check) for m in CATALOG
             if m.check not in made.get(m.scenario, set()) and m.check not in literals]
    assert not stale, stale
