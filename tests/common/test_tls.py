"""Transport settings: TLS by default, plaintext only on loopback, certificates
rotated without a restart, the bound address in the log."""

from __future__ import annotations

import logging
import os
import shutil

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath.client import channel
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal, service_principal
from lightpath.security.pki import LocalCA
from lightpath_services.common.settings import CommonSettings, load
from lightpath_services.common.tls import TransportError, check, is_loopback
from tests.helpers import credentials, serve, test_ca


def _settings(**env: str) -> CommonSettings:
    return load(CommonSettings, {"LIGHTPATH_LISTEN": "127.0.0.1:0", **env})


def test_a_service_without_tls_files_or_plaintext_refuses_to_start():
    with pytest.raises(TransportError, match="LIGHTPATH_TLS_CERT"):
        check(_settings())


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:0", "10.1.2.3:50051", "myhost:1"])
def test_plaintext_binds_loopback_only(listen):
    with pytest.raises(TransportError, match="loopback"):
        check(_settings(LIGHTPATH_PLAINTEXT="true", LIGHTPATH_LISTEN=listen))


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "[::1]:50051", "localhost:1", "127.0.0.9:2"])
def test_plaintext_on_loopback_is_allowed(listen):
    assert is_loopback(listen)
    check(_settings(LIGHTPATH_PLAINTEXT="true", LIGHTPATH_LISTEN=listen))


def test_mtls_needs_a_ca_and_readable_files(tmp_path):
    files = test_ca().issue(service_principal("cell_scheduler"))
    with pytest.raises(TransportError, match="LIGHTPATH_TLS_CA"):
        check(_settings(LIGHTPATH_TLS_CERT=str(files.cert), LIGHTPATH_TLS_KEY=str(files.key)))
    with pytest.raises(TransportError, match="cannot be read"):
        check(
            _settings(
                LIGHTPATH_TLS_CERT=str(tmp_path / "missing.crt"),
                LIGHTPATH_TLS_KEY=str(files.key),
                LIGHTPATH_TLS_CA=str(files.ca),
            )
        )
    # server-only TLS needs no CA
    check(
        _settings(
            LIGHTPATH_TLS_CERT=str(files.cert),
            LIGHTPATH_TLS_KEY=str(files.key),
            LIGHTPATH_TLS_CLIENT_AUTH="none",
        )
    )


async def _health(address: str, creds: Credentials) -> str:
    async with channel(address, credentials=creds, max_attempts=1) as ch:
        try:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=3
            )
        except grpc.aio.AioRpcError as err:
            return err.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


async def test_certificates_are_rotated_without_a_restart(redis_url, tmp_path, caplog):
    """The service serves a certificate of CA 1; its files are replaced by one of CA 2;
    a client that trusts only CA 2 is refused before and served after, same process."""
    ca1 = LocalCA(tmp_path / "ca1").ensure()
    ca2 = LocalCA(tmp_path / "ca2").ensure()
    me = service_principal("cell_scheduler")
    live = tmp_path / "live"
    live.mkdir()
    first = ca1.issue(me)
    shutil.copy(first.cert, live / "tls.crt")
    shutil.copy(first.key, live / "tls.key")
    env = {
        "LIGHTPATH_TLS_CERT": str(live / "tls.crt"),
        "LIGHTPATH_TLS_KEY": str(live / "tls.key"),
        "LIGHTPATH_TLS_CA": str(test_ca().cert_path),  # clients: the tests' CA
    }
    client = credentials("operator:operator")

    def trusting(ca: LocalCA) -> Credentials:
        return Credentials(ca.cert_path.read_bytes(), client.cert, client.key, tls=True)

    caplog.set_level(logging.INFO, logger="lightpath.tls")
    async with serve("cell_scheduler", redis_url, env) as svc:
        assert await _health(svc.address, trusting(ca1)) == "SERVING"
        assert await _health(svc.address, trusting(ca2)) == "UNAVAILABLE"
        second = ca2.issue(me)
        # each file replaced whole (rename), as cert-manager and kubelet do
        os.replace(shutil.copy(second.key, live / "tls.key.new"), live / "tls.key")
        os.replace(shutil.copy(second.cert, live / "tls.crt.new"), live / "tls.crt")
        assert await _health(svc.address, trusting(ca2)) == "SERVING"
        assert await _health(svc.address, trusting(ca1)) == "UNAVAILABLE"
    assert any("certificate files changed" in r.getMessage() for r in caplog.records)


async def test_the_bound_address_and_security_are_logged(redis_url, caplog):
    caplog.set_level(logging.INFO, logger="lightpath.server")
    async with serve("core_broker", redis_url) as svc:
        pass
    lines = [r.getMessage() for r in caplog.records if "serving on" in r.getMessage()]
    assert lines == [
        f"core_broker serving on 127.0.0.1:{svc.port} (TLS, client certificates required)"
    ]


async def test_a_plaintext_service_authenticates_by_token_only(redis_url):
    from lightpath.security.tokens import TokenRegistry
    from lightpath.v1 import cell_scheduler_pb2 as cs
    from lightpath.v1 import cell_scheduler_pb2_grpc

    async with serve("cell_scheduler", redis_url, {"LIGHTPATH_PLAINTEXT": "true"}) as svc:
        _, token = await TokenRegistry(svc.runtime.redis).issue(Principal("operator", "op"))
        async with channel(svc.address, credentials=Credentials(token=token)) as ch:
            pods = await cell_scheduler_pb2_grpc.CellSchedulerStub(ch).ListPods(
                cs.ListPodsRequest()
            )
            assert list(pods.pods) == []
        async with channel(svc.address, credentials=Credentials()) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cell_scheduler_pb2_grpc.CellSchedulerStub(ch).ListPods(cs.ListPodsRequest())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_tenants_certificate_cannot_pose_as_a_server(redis_url, tmp_path):
    """Only service certificates may serve: a client refuses a server that presents a
    tenant's certificate, though the same CA issued it."""
    ca = LocalCA(tmp_path / "ca").ensure()
    tenant = ca.issue(Principal("tenant", "mallory"))
    service = ca.issue(service_principal("cell_scheduler"))
    client_files = ca.issue(Principal("operator", "operator"))
    client = Credentials.from_files(client_files.ca, client_files.cert, client_files.key)
    for files, expected in ((service, "SERVING"), (tenant, "UNAVAILABLE")):
        env = {
            "LIGHTPATH_TLS_CERT": str(files.cert),
            "LIGHTPATH_TLS_KEY": str(files.key),
            "LIGHTPATH_TLS_CA": str(ca.cert_path),
        }
        async with serve("cell_scheduler", redis_url, env) as svc:
            assert await _health(svc.address, client) == expected


async def test_getinfo_is_open_to_any_certificate_of_the_ca_but_not_to_none(redis_url):
    """docs/security.md (issue 30): GetInfo needs no role, but under the default
    LIGHTPATH_TLS_CLIENT_AUTH=require a caller without a certificate never gets past the
    handshake; with `none`, it is answered."""
    from lightpath.v1 import cell_scheduler_pb2_grpc, common_pb2

    ca = test_ca().cert_path.read_bytes()
    nobody = Credentials(ca=ca, tls=True)

    async def info(address: str, creds: Credentials) -> str:
        async with channel(address, credentials=creds, max_attempts=1) as ch:
            try:
                got = await cell_scheduler_pb2_grpc.CellSchedulerStub(ch).GetInfo(
                    common_pb2.GetInfoRequest(), timeout=3
                )
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return got.service

    async with serve("cell_scheduler", redis_url) as svc:
        assert await info(svc.address, nobody) == "UNAVAILABLE"
        assert await info(svc.address, credentials("node:n1")) == "lightpath.v1.CellScheduler"
    async with serve("cell_scheduler", redis_url, {"LIGHTPATH_TLS_CLIENT_AUTH": "none"}) as svc:
        assert await info(svc.address, nobody) == "lightpath.v1.CellScheduler"
