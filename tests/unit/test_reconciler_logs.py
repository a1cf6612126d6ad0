"""A sweep that cannot check a tenant's workflows says why in a machine-readable way: the
event, the exception's type and Temporal's gRPC status, never the error's message (R-OPS-3)."""

from __future__ import annotations

from temporalio.service import RPCError, RPCStatusCode

from qimpl.reconciler import _rpc_status, _why


def test_an_unchecked_sweep_names_the_rpc_status_and_nothing_else() -> None:
    err = RPCError("connection to 10.0.0.7:7233 refused", RPCStatusCode.UNAVAILABLE, b"")
    assert (_rpc_status(err), _why(err)) == ("UNAVAILABLE", "RPCError (UNAVAILABLE)")
    assert "10.0.0.7" not in _why(err)
    assert (_rpc_status(TimeoutError()), _why(TimeoutError())) == (None, "TimeoutError")
