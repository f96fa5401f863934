"""Every client checks whom it reached (issue 30): on each peer link an impostor, a real
TLS server presenting another service's certificate from the same CA, is refused in the
handshake; the call fails UNAVAILABLE naming the identity expected and the one found, and
the impostor never sees a request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from lightpath.client import channel, error_report
from lightpath.security.identity import Principal, dns_name, service_principal
from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import cell_scheduler_pb2_grpc, ocs_manager_pb2_grpc
from lightpath.v1 import common_pb2 as c
from lightpath.v1 import ocs_manager_pb2 as ocs
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.console.backends import Backends
from tests.helpers import credentials, identity, serve


@dataclass
class Impostor:
    address: str
    principal: Principal
    calls: list[str] = field(default_factory=list)
    connections: int = 0


class _Recorder(grpc.GenericRpcHandler):
    def __init__(self, calls: list[str]):
        self.calls = calls

    def service(self, handler_call_details):  # any request that got through is recorded
        self.calls.append(handler_call_details.method)
        return None  # UNIMPLEMENTED


@contextlib.asynccontextmanager
async def impostor(principal: Principal | str) -> AsyncIterator[Impostor]:
    """A gRPC server over mTLS with `principal`'s certificate from the tests' CA, behind a
    TCP relay that counts the connections made to it."""
    if isinstance(principal, str):
        principal = Principal.parse(principal)
    files = identity(principal)
    server = grpc.aio.server()
    calls: list[str] = []
    server.add_generic_rpc_handlers((_Recorder(calls),))
    creds = grpc.ssl_server_credentials(
        [(files.key.read_bytes(), files.cert.read_bytes())],
        root_certificates=files.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    me = Impostor("", principal, calls)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me.connections += 1
        up_r, up_w = await asyncio.open_connection("127.0.0.1", port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    front = await asyncio.start_server(relay, "127.0.0.1", 0)
    me.address = f"127.0.0.1:{front.sockets[0].getsockname()[1]}"
    try:
        yield me
    finally:
        front.close()
        await server.stop(None)


def assert_refused(err: grpc.aio.AioRpcError | Exception, expected: Principal, found: Principal):
    """UNAVAILABLE, naming whom the caller meant and whom it found."""
    message = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
    code = err.code() if isinstance(err, grpc.aio.AioRpcError) else getattr(err, "code", None)
    assert code in (grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"), (code, message)
    assert str(expected) in message, message
    assert str(found) in message, message


async def until(check, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_identity_dns_names_are_distinct_and_valid():
    names = [
        "service:ocs_manager/pod-1",
        "service:ocs_manager/Pod-1",
        "service:ocs_manager/pod_1",
        "service:ocs-manager/pod-1",
        "service:switch_agent/pod-1",
        "service:cell_scheduler",
        "tenant:" + "a" * 64,
    ]
    dns = [dns_name(Principal.parse(n)) for n in names]
    assert len(set(dns)) == len(dns)
    for d in dns:
        assert len(d) <= 253 and d.endswith(".lightpath")
        assert all(1 <= len(label) <= 63 for label in d.split(".")), d
    assert dns[0].startswith("ocs-manager.pod-1.")


def test_certificates_carry_their_identity_dns_name_and_old_ones_are_reissued(tmp_path):
    from cryptography import x509

    from lightpath.security.pki import LocalCA

    ca = LocalCA(tmp_path / "ca").ensure()
    me = service_principal("ocs_manager", "pod-1")
    files = ca.issue(me)
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert dns_name(me) in sans.get_values_for_type(x509.DNSName)
    assert ca._still_good(files, me, ())
    assert not ca._still_good(files, service_principal("ocs_manager", "pod-2"), ())


async def test_a_client_refuses_a_server_of_another_identity_before_sending():
    meant = service_principal("cell_scheduler")
    async with impostor("service:core_broker") as imp:
        async with channel(imp.address, max_attempts=1, expect=meant) as ch:
            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetInfo(c.GetInfoRequest())
        assert_refused(info.value, meant, imp.principal)
        assert imp.calls == []
        # the same server, meant: the request reaches it (and it answers UNIMPLEMENTED)
        async with channel(imp.address, max_attempts=1, expect=imp.principal) as ch:
            stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetInfo(c.GetInfoRequest())
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert imp.calls == ["/lightpath.v1.CellScheduler/GetInfo"]


OCS_ENV = {
    "LIGHTPATH_POD_ID": "pod-1",
    "LIGHTPATH_FABRIC_BLOCK_SHAPE": "2x2x2",
    "LIGHTPATH_FABRIC_BLOCKS": "8",
    "LIGHTPATH_FABRIC_OCS_PER_AXIS": "1",
    "LIGHTPATH_FABRIC_OCS_RADIX": "24",
}


async def test_the_ocs_manager_programs_only_its_pods_switch_agent(redis_url):
    # another pod's agent, on the address this pod's agent should be at
    async with impostor("service:switch_agent/pod-2") as imp:
        env = {
            **OCS_ENV,
            "LIGHTPATH_OCS_SWITCH_AGENTS": imp.address,
            "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "2",
            "LIGHTPATH_OCS_RECONCILE_S": "0.2",
        }
        async with serve("ocs_manager", redis_url, env) as svc:
            async with channel(
                svc.address,
                credentials=credentials("service:workload_scheduler/pod-1"),
                max_attempts=1,
            ) as ch:
                stub = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.WireSlice(
                        ocs.WireSliceRequest(
                            job_id="j1",
                            grid=c.Shape(dims=[1, 1, 1]),
                            blocks=[
                                ocs.BlockPlacement(
                                    block_id=0, position=c.Coordinate(coords=[0, 0, 0])
                                )
                            ],
                        )
                    )
            await until(lambda: imp.connections >= 2)  # the reconciler tried too
        report = error_report(info.value)
        assert report.code == grpc.StatusCode.UNAVAILABLE, report
        assert "service:switch_agent/pod-1" in report.message, report
        assert imp.calls == []


async def test_the_workload_scheduler_wires_only_through_its_pods_ocs_manager(redis_url):
    async with impostor("service:ocs_manager/pod-2") as imp:
        env = {**OCS_ENV, "LIGHTPATH_OCS_ADDR": imp.address}
        async with serve("workload_scheduler", redis_url, env):
            await until(lambda: imp.connections >= 1)
            await asyncio.sleep(0.2)
        assert imp.calls == []


async def test_the_workload_scheduler_reports_only_to_the_cell(redis_url):
    async with impostor("service:workload_scheduler/pod-2") as imp:
        async with serve("ocs_manager", redis_url, OCS_ENV) as o:
            env = {**OCS_ENV, "LIGHTPATH_OCS_ADDR": o.address, "LIGHTPATH_CELL_ADDR": imp.address}
            async with serve("workload_scheduler", redis_url, env):
                await until(lambda: imp.connections >= 2)
        assert imp.calls == []


async def test_the_cell_calls_only_the_pod_that_registered(redis_url):
    async with impostor("service:workload_scheduler/pod-2") as imp:
        async with serve("cell_scheduler", redis_url) as cell:
            async with channel(
                cell.address, credentials=credentials("service:workload_scheduler/pod-1")
            ) as ch:
                pod = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
                await pod.RegisterPod(
                    cs.RegisterPodRequest(
                        pod=cs.PodRegistration(
                            pod_id="pod-1",
                            endpoint=imp.address,  # another pod's scheduler is there
                            fabric_kind=c.FABRIC_KIND_OCS_TORUS,
                            block_shape=c.Shape(dims=[2, 2, 2]),
                            node_types=[cs.NodeTypeBlocks(node_type="tpu", blocks=8)],
                            ocs_per_axis=1,
                            instance_id="ws-1",
                        )
                    )
                )
                capacity = cs.PodCapacity(
                    types=[cs.NodeTypeCapacity(node_type="tpu", total=8, free=8)]
                )
                capacity.at.GetCurrentTime()
                await pod.ReportPodStatus(
                    cs.ReportPodStatusRequest(
                        pod_id="pod-1", instance_id="ws-1", endpoint=imp.address, capacity=capacity
                    )
                )
            async with channel(cell.address, max_attempts=1) as ch:  # the operator
                stub = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
                await stub.SubmitJob(
                    cs.SubmitJobRequest(spec=ws.JobSpec(job_id="j1", shape=c.Shape(dims=[2, 2, 2])))
                )
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while (
                    "was not reached"
                    not in (job := await stub.GetJob(cs.GetCellJobRequest(job_id="j1"))).reason
                ):
                    assert loop.time() < deadline, job
                    await asyncio.sleep(0.05)
        # back in the cell's queue, saying whom the cell meant and whom it found
        assert job.state == c.JOB_STATE_PENDING, job
        assert "service:workload_scheduler/pod-1" in job.reason, job.reason
        assert "service:workload_scheduler/pod-2" in job.reason, job.reason
        assert imp.calls == []


async def test_the_console_reads_only_the_services_it_shows():
    async with impostor("service:switch_agent/pod-1") as imp:
        creds = credentials("service:console")
        backends = Backends(creds, cell=imp.address, ocs={"pod-1": imp.address})
        try:
            with pytest.raises(Exception) as info:
                await backends.cell.ListPods(cs.ListPodsRequest())
            assert_refused(info.value, service_principal("cell_scheduler"), imp.principal)
            with pytest.raises(Exception) as info:
                await backends.ocs["pod-1"].GetFabric(ocs.GetFabricRequest())
            assert_refused(info.value, service_principal("ocs_manager", "pod-1"), imp.principal)
        finally:
            await backends.close()
        assert imp.calls == []


async def test_a_switch_relays_only_to_the_switch_it_meant(redis_url):
    """sub-1's parent is root; on root's address (the topology's endpoint) another
    switch's server answers: sub-1's Relay is refused in the handshake, the impostor
    gets no partial, and the command does not end with a result it never saw."""
    from lightpath.aggregation.node import aggregate_all
    from lightpath.v1 import agg_switch_pb2 as agg
    from tests.agg_switch.tree import CN, SW, agg_tree, node, node_credentials

    async with impostor("service:agg_switch/sub-2") as imp:
        async with agg_tree(redis_url, switches=("root", "sub-1"), transport="grpc") as tree:
            await tree.define(
                [
                    node("root", SW, "", 1000, endpoint=imp.address),
                    node("sub-1", SW, "root", 1000),
                    node("n1", CN, "sub-1"),
                    node("n2", CN, "sub-1"),
                ]
            )
            await tree.start("c1", ["n1", "n2"], 4, chunk_bytes=32, deadline_s=3.0)
            data = {n: np.arange(4, dtype=np.int64) for n in ("n1", "n2")}
            with contextlib.suppress(Exception):  # no result can come: root gets nothing
                await asyncio.wait_for(
                    aggregate_all(tree.address(), "c1", data, credentials=node_credentials), 20
                )
            await until(lambda: imp.connections >= 1)
            command = await tree.command("c1")
        assert command.state != agg.AGG_COMMAND_STATE_COMPLETED, command
        assert imp.calls == []
