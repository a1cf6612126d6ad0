"""``WorkerSettings``: the worker process (``python -m qimpl.workflows.worker``),
reconciler and takeover watcher included."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from qimpl.settings._fields import _example, _import_path, _json_value
from qimpl.settings.base import Settings, _ProviderSettings

__all__ = ["WorkerSettings"]


class WorkerSettings(_ProviderSettings, Settings):
    """The worker process (``python -m qimpl.workflows.worker``), reconciler included."""

    tools: str = Field(
        default="", description="the worker's tool registry, `module:factory` returning `ToolSpec`s (`qimpl/tool_journal/seam.py`); empty: no tools",
        json_schema_extra=_example("qualify.fakes.tools:sink_tools"))
    tools_config: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="JSON object given to the tools factory",
        json_schema_extra=_example('{"sink_url": "http://127.0.0.1:9000"}'))
    max_concurrent_activities: int = Field(
        default=1000, ge=1,
        description="activities per worker (runs in flight at once): a model-bound run mostly waits for its provider, and its lease is one advisory lock on a shared lease session (`lease_session_runs` runs a session), not a session of its own (issue 55, R-EXEC-14)",
        json_schema_extra=_example("1000"))
    lease_session_runs: int = Field(
        default=50, ge=1,
        description="runs whose advisory locks one lease session carries (R-EXEC-2): the worker holds at most `ceil((max_concurrent_activities + takeover_slots) / lease_session_runs)` lease sessions; a lost session moves exactly the runs it carried. 1: a session per run",
        json_schema_extra=_example("50"))
    workflow_sandbox: bool = Field(
        default=False,
        description="run workflows in temporalio's sandbox (each run imports its workflow module afresh; non-deterministic calls raise). Off: qimpl's workflows only schedule activities and hold no module state, the tests run every branch of them in the sandbox, and the sandbox cost about 4-5 ms of the worker's CPU per run (issue 21). Turn it on while you change workflow code",
        json_schema_extra=_example("false"))
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="the worker's asyncio event loop: `uvloop` (libuv; less of the worker's CPU per run on the activities' database I/O) or the standard library's `asyncio` (issue 21). The API's is uvicorn's choice (`--loop`, uvloop when installed)",
        json_schema_extra=_example("uvloop"))
    reconcile_interval_s: float = Field(default=5.0, gt=0, description="seconds between sweeps (R-OPS-3)",
                                        json_schema_extra=_example("5"))
    metrics_port: int = Field(
        default=0, ge=0, le=65535,
        description="the worker's Prometheus port on 127.0.0.1; 0: off (the API serves `/metrics` itself, to operator keys)",
        json_schema_extra=_example("9464"))
    takeover_watch: bool = Field(
        default=True,
        description="run the takeover watcher: fail the Temporal attempt of a `running` run whose lease is gone at once, instead of after Temporal's heartbeat timeout (R-EXEC-13). One worker at a time watches each task queue (a session advisory lock); any number may run it",
        json_schema_extra=_example("true"))
    takeover_poll_s: float = Field(
        default=0.1, ge=0.02, le=10,
        description="seconds between the takeover watcher's looks for runs whose lease is gone (one query reading `pg_locks` once)",
        json_schema_extra=_example("0.1"))
    takeover_unclaimed_s: float = Field(
        default=0.3, ge=0.05, le=60,
        description="seconds a started Temporal attempt of a run whose lease is gone may go without a heartbeat or a claim before the watcher fails it (the attempt a paused worker's outstanding poll took and never runs, R-EXEC-13); one that heartbeated, twice that",
        json_schema_extra=_example("0.3"))
    takeover_slots: int = Field(
        default=4, ge=0, le=1000,
        description="activities this worker runs from its own takeover queue, beside `max_concurrent_activities` (each holds one run's lease): the watcher moves a run whose lease is gone there before it fails the dead attempt, so the retry cannot go to a paused worker's outstanding poll (R-EXEC-13); 0: no takeover queue, the retry goes to the shared queue",
        json_schema_extra=_example("4"))
    reconcile_tenants: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        validation_alias=AliasChoices("DURABLE_AGENT_RECONCILE_TENANTS", "QIMPL_RECONCILE_TENANTS"),
        description="JSON list of tenants this worker reconciles; `[]`: no sweep (R-OPS-3)",
        json_schema_extra=_example('["acme"]'))

    @field_validator("tools")
    @classmethod
    def _tools_path(cls, value: str) -> str:
        return _import_path(value) if value else value

    @field_validator("tools_config", mode="before")
    @classmethod
    def _tools_json(cls, value: Any) -> Any:
        return _json_value(value, dict)

    @field_validator("reconcile_tenants", mode="before")
    @classmethod
    def _tenants_json(cls, value: Any) -> Any:
        return _json_value(value, list)
