"""Issue 30: tenancy without magic names.

What is submitted without a tenant belongs to the operators, under a name no tenant
can have: every reserved name is refused by `lightpath tenant create`, by the CA and
by the token registry, and a credential that carries one anyway (a token stored by
an older release, a certificate from another CA tool) authenticates nobody.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from lightpath.cli import main
from lightpath.client import channel
from lightpath.security.identity import (
    NO_TENANT,
    RESERVED_TENANTS,
    TENANT,
    IdentityError,
    Principal,
    from_uri,
)
from lightpath.security.pki import LocalCA
from lightpath.security.tokens import KEY, PREFIX, TokenRegistry, _digest
from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc
from lightpath_services.agg_switch.command import NO_TENANT as AGG_NO_TENANT
from lightpath_services.cell_scheduler.request import tenant_of
from tests.helpers import credentials, serve

NAMES = sorted({*RESERVED_TENANTS, *(n.upper() for n in RESERVED_TENANTS), "Default"})


def test_what_has_no_tenant_is_under_a_reserved_name():
    assert NO_TENANT in RESERVED_TENANTS
    assert tenant_of(cell_scheduler_pb2.SubmitJobRequest()) == NO_TENANT
    assert AGG_NO_TENANT == NO_TENANT


@pytest.mark.parametrize("name", NAMES)
def test_no_principal_and_no_certificate_can_carry_a_reserved_tenant_name(name):
    with pytest.raises(IdentityError, match="reserved"):
        Principal(TENANT, name)
    with pytest.raises(IdentityError, match="reserved"):
        Principal.parse(f"tenant:{name}")
    assert from_uri(f"spiffe://lightpath/tenant/{name}") is None
    # other kinds may use the words: an operator called `admin` is fine
    assert Principal("operator", name).name == name


def test_tenant_create_refuses_every_reserved_name(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("LIGHTPATH_STATE_DIR", str(tmp_path))
    LocalCA(tmp_path / "pki").ensure()
    for name in NAMES:
        code = main(["tenant", "create", name])
        err = capsys.readouterr().err
        assert code == 2, name
        assert "reserved" in err and "Traceback" not in err, err
    assert not list((tmp_path / "pki").glob("tenant-*"))  # nothing issued


async def test_a_token_stored_for_a_reserved_tenant_authenticates_nobody(redis_url, redis_client):
    # As an older release would have stored it: straight into the registry.
    salt, secret, token_id = "00", "s3cret", "ab" * 16
    await redis_client.hset(
        KEY,
        token_id,
        json.dumps(
            {
                "kind": TENANT,
                "name": NO_TENANT,
                "salt": salt,
                "sha256": _digest(salt, secret),
                "created": 0,
            }
        ),
    )
    token = f"{PREFIX}.{token_id}.{secret}"
    assert await TokenRegistry(redis_client).verify(token) is None
    async with (
        serve("cell_scheduler", redis_url) as cell,
        channel(
            cell.address, max_attempts=1, credentials=credentials("operator:x", token=token)
        ) as ch,
    ):
        # The operator's certificate is presented too, but a bearer token names the caller.
        stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListJobs(cell_scheduler_pb2.ListCellJobsRequest())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
