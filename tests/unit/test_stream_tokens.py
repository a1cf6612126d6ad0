"""Stream tokens for browsers (R-EVENT-6): bound to one run, signed with its stream key."""

from __future__ import annotations

import uuid

import pytest

from qimpl.api.stream_tokens import mint, parse, valid

RUN = str(uuid.uuid4())


@pytest.mark.req("R-EVENT-6")
def test_a_token_names_its_run_and_only_its_stream_key_verifies_it() -> None:
    token = mint(stream_key="k" * 32, tenant_id="t.dev", run_id=RUN, expires=1_900_000_000)
    got = parse(token)
    assert (got.tenant_id, got.run_id, got.expires) == ("t.dev", RUN, 1_900_000_000)
    assert valid(got, stream_key="k" * 32)
    assert not valid(got, stream_key="x" * 32)
    assert "k" * 32 not in token


@pytest.mark.req("R-EVENT-6")
def test_a_changed_token_is_refused() -> None:
    token = mint(stream_key="secret-stream-key", tenant_id="t", run_id=RUN, expires=1_900_000_000)
    other_run = token.replace(RUN, str(uuid.uuid4()))
    later = token.replace(".1900000000.", ".1900009999.")
    for forged in (other_run, later):
        assert not valid(parse(forged), stream_key="secret-stream-key")
    for junk in ("", "v1", "v2." + token[3:], token + ".x", "v1.!!.x.1.y", f"v1.dA.{RUN}.-5.mac", "a" * 500):
        with pytest.raises(ValueError):
            parse(junk)
