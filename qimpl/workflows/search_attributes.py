"""The Temporal search attributes of a run's workflows (issue 25, item 14): how an
operator finds a run's generations by tenant and by outcome in Temporal's own tools
(``temporal workflow list --query …``, the Web UI), documented in ``docs/operations.md``.

Each generation's workflow is started with ``QimplTenant``, ``QimplRunId`` and
``QimplGeneration`` (``at_start``, by ``qimpl.dispatch``; version 2 of the workflow set
them itself at its first task), and sets, when it ends, whichever way (its activity's
answer, the give-up activity's, or after a cancel request the run's state read back:
``qimpl.workflows.agent_run.CANCELLED_STATE_PATCH_ID``), ``QimplRunState``:
the run's state as that generation left it (``completed``, ``failed``, ``expired``,
``cancelled``, ``awaiting_input``, …). Temporal itself shows every generation
``Completed`` whatever the run's outcome; ``QimplRunState`` is the outcome.

A namespace must have them registered before a workflow is started with them (Temporal
refuses the start) or sets them (the workflow task fails, again and again): like a schema migration it is a
deploy step (``temporal operator search-attribute create``, or ``register`` here, which
the harness's stacks and ``qualify up`` call). A worker with
``QIMPL_TEMPORAL_SEARCH_ATTRIBUTES`` on checks at start and exits 64 naming what is
missing (``qimpl.workflows.worker``).
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

__all__ = ["ATTRIBUTES", "GENERATION", "PATCH_ID", "RUN_ID", "RUN_STATE", "TENANT",
           "at_start", "create_commands", "missing", "register"]

TENANT = SearchAttributeKey.for_keyword("QimplTenant")
RUN_ID = SearchAttributeKey.for_keyword("QimplRunId")
GENERATION = SearchAttributeKey.for_int("QimplGeneration")
RUN_STATE = SearchAttributeKey.for_keyword("QimplRunState")

#: name → Temporal's indexed value type, as ``temporal operator search-attribute create``
#: spells it.
ATTRIBUTES: Mapping[str, str] = {TENANT.name: "Keyword", RUN_ID.name: "Keyword",
                                 GENERATION.name: "Int", RUN_STATE.name: "Keyword"}

#: The ``workflow.patched`` id of the change that set them: histories recorded before it
#: replay without the upserts (R-EXEC-10).
PATCH_ID = "qimpl-search-attributes-1"

_TYPES = {"Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
          "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT}


def at_start(tenant_id: str, run_id: str, generation: int) -> TypedSearchAttributes:
    """The attributes a generation's workflow is started with (``qimpl.dispatch``):
    ``QimplTenant``, ``QimplRunId`` and ``QimplGeneration``."""
    return TypedSearchAttributes([SearchAttributePair(TENANT, tenant_id), SearchAttributePair(RUN_ID, run_id),
                                  SearchAttributePair(GENERATION, generation)])


def create_commands(namespace: str) -> list[str]:
    """The CLI commands that register every attribute in ``namespace``."""
    return [f"temporal operator search-attribute create --namespace {namespace} "
            f"--name {name} --type {kind}" for name, kind in ATTRIBUTES.items()]


async def missing(client: Client, namespace: str) -> list[str]:
    """Names of the attributes ``namespace`` lacks (or has with another type). Raises the
    client's ``RPCError`` when Temporal cannot answer."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace))
    have = dict(listed.custom_attributes)
    return [name for name, kind in ATTRIBUTES.items() if have.get(name) != _TYPES[kind]]


async def register(client: Client, namespace: str) -> None:
    """Register every missing attribute in ``namespace`` (idempotent). Raises ``RPCError``
    when Temporal refuses (for example a name taken with another type)."""
    absent = await missing(client, namespace)
    if absent:
        await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
            namespace=namespace, search_attributes={n: _TYPES[ATTRIBUTES[n]] for n in absent}))
