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


def test_a_key_names_only_a_tenant_whose_stream_tokens_the_events_route_takes(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A tester created a key of a 1,000-character tenant (and one with a control
    character): its runs worked, but every stream token minted for them was 1,429
    characters and the events route (``stream_token`` at most 400) refused it, 422."""
    from qimpl.scripts.api_keys import main
    from qimpl.settings import MAX_TENANT_BYTES

    longest = "é" * (MAX_TENANT_BYTES // 2)  # two bytes each
    token = mint(stream_key="k" * 32, tenant_id=longest, run_id=str(uuid.uuid4()), expires=2**40)
    assert len(token) <= 400 and parse(token).tenant_id == longest
    for argv in (["create", "--tenant", "a" * (MAX_TENANT_BYTES + 1), "--principal", "p"],
                 ["create", "--tenant", "é" * (MAX_TENANT_BYTES // 2 + 1), "--principal", "p"],
                 ["create", "--tenant", "a\x01b", "--principal", "p"],
                 ["grant", "--tenant", "a" * 1000, "--principal", "p", "--workspace", "w", "--grant-token", "g"],
                 ["assign", "--key-id", "key_x", "--tenant", "a\nb"]):
        with pytest.raises(SystemExit) as refused:
            main(argv)  # refused before any setting is read or any connection is made
        assert refused.value.code == 64, argv
        assert "--tenant " in capsys.readouterr().err
