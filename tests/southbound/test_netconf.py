"""The NETCONF driver (ncclient) against a real NETCONF server process over SSH serving the
Polatis optical-switch model (issue 34)."""

from __future__ import annotations

import grpc
import pytest

from lightpath.client import error_report
from lightpath.domain.southbound import devices
from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath_services.ocs_manager.netconf_driver import (
    IDLE_TICK_S,
    NetconfCredentials,
    NetconfSwitch,
)
from tests.southbound.labs import netconf_lab, start_netconf

FABRIC = Fabric.build(
    FabricConfig(block_shape=(2, 2, 2), block_count=4, ocs_per_axis=1, ocs_radix=12)
)
SID = "ocs-x-0-0"
DEVICE = next(d for d in devices(FABRIC) if d.id == SID)


def batch(key: str, connect=(), disconnect=()) -> pb.ApplyBatchRequest:
    return pb.ApplyBatchRequest(
        switch_id=SID,
        batch_id=key,
        connect=[pb.PortPair(port_a=p, port_b=q) for p, q in connect],
        disconnect=[pb.PortPair(port_a=p, port_b=q) for p, q in disconnect],
    )


@pytest.fixture
def lab(tmp_path):
    with netconf_lab(FABRIC, tmp_path, only={SID}) as lab:
        yield lab


def creds(lab) -> NetconfCredentials:
    return NetconfCredentials(
        password=lab.password_file.read_text(), known_hosts=str(lab.known_hosts)
    )


@pytest.fixture
async def switch(lab):
    sw = NetconfSwitch(FABRIC, DEVICE, lab.url(SID), creds(lab), settle_timeout_s=10)
    yield sw
    await sw.close()


async def test_pairs_are_merged_and_deleted_over_ssh(lab, switch):
    d = await switch.Describe(pb.DescribeSwitchRequest(switch_id=SID))
    assert d.kind == pb.SWITCH_KIND_OCS and d.ports == 8 and "Polatis" in d.vendor
    # N = 6: first end 1 -> ingress 2, second end 0 (port 4) -> egress 6 + 1 = 7
    reply = await switch.ApplyBatch(batch("k1", connect=[(4, 1), (5, 0)]), timeout=10)
    assert reply.applied.connects == 2
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(1, 4), (0, 5)}
    power = await switch.power()
    assert -2.5 <= power[4] <= -1.0 and power[2] == -60.0

    # re-patch: one edit-config, deletes before merges
    await switch.ApplyBatch(batch("k2", connect=[(4, 0)]), timeout=10)
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(0, 4)}
    assert switch.stats.edits == 2
    assert (await switch.ApplyBatch(batch("k2", connect=[(4, 0)]), timeout=10)).replayed


async def test_device_errors_map_to_the_contract(lab, switch, tmp_path):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("a", connect=[(4, 5)]), timeout=10)  # B to B
    assert error_report(err.value).code == grpc.StatusCode.INVALID_ARGUMENT

    # another session changed the switch since it was read: a guarded batch is refused
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    other = NetconfSwitch(FABRIC, DEVICE, lab.url(SID), creds(lab))
    await other.ApplyBatch(batch("x", connect=[(4, 3)]), timeout=10)
    await other.close()
    guarded = batch("y", connect=[(5, 2)])
    guarded.expect_version = st.version
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(guarded, timeout=10)
    assert error_report(err.value).reason == "VERSION_MISMATCH"

    lab.stop()  # the device goes away
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await switch.ApplyBatch(batch("b", connect=[(4, 0)]), timeout=10)
    rep = error_report(err.value)
    assert (rep.code, rep.reason) == (grpc.StatusCode.UNAVAILABLE, "SWITCH_UNREACHABLE")

    # it comes back empty on the same address: a new session, so a new boot id
    again = start_netconf([SID], lab.ports, tmp_path, reuse=lab)
    try:
        st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
        assert not st.cross_connects
        await switch.ApplyBatch(batch("c", connect=[(4, 0)]), timeout=10)
    finally:
        again.stop()


async def test_a_host_key_not_pinned_is_refused(lab):
    lab.known_hosts.write_text("")
    sw = NetconfSwitch(FABRIC, DEVICE, lab.url(SID), creds(lab))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await sw.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID), timeout=10)
    assert "known_hosts" in error_report(err.value).message
    await sw.close()


async def test_a_batch_planned_without_a_read_is_guarded_by_the_device(lab, switch):
    """After a read, a batch is planned on the table the driver knows and sent without a
    read; its `create` / `delete` are the guard: when another session moved the pairs
    it touches, the switch refuses the edit whole and the batch reads and plans again."""
    await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    await switch.ApplyBatch(batch("u1", connect=[(4, 1), (5, 0)]), timeout=10)
    assert (switch.stats.planned_unread, switch.stats.replans) == (1, 0)

    # another session re-patches ingress 2 (first end 1) behind the driver's back
    other = NetconfSwitch(FABRIC, DEVICE, lab.url(SID), creds(lab))
    await other.ApplyBatch(batch("o1", connect=[(6, 1)]), timeout=10)
    # the driver still believes 1-4: its delete of (2, 7) finds no such pair
    reply = await switch.ApplyBatch(batch("u2", disconnect=[(4, 1)], connect=[(7, 2)]), timeout=10)
    assert (switch.stats.planned_unread, switch.stats.replans) == (2, 1)
    assert reply.applied.connects == 1
    st = await other.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    # absolute semantics on what the switch held: 1-4 was already gone, 1-6 stays
    assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(0, 5), (1, 6), (2, 7)}
    assert reply.version == st.version

    # a make onto an ingress another session made it on: data-exists, read, nothing to do
    await other.ApplyBatch(batch("o2", connect=[(4, 3)]), timeout=10)
    await other.close()
    edits = switch.stats.edits
    await switch.ApplyBatch(batch("u3", connect=[(4, 3)]), timeout=10)
    assert (switch.stats.planned_unread, switch.stats.replans) == (3, 2)
    assert switch.stats.edits == edits + 1  # the refused one; the read found it made
    # a connect the known table already holds is not checked by the device: read first
    await switch.ApplyBatch(batch("u4", connect=[(4, 3)]), timeout=10)
    assert switch.stats.planned_unread == 3
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(0, 5), (1, 6), (2, 7), (3, 4)}


async def test_an_idle_session_wakes_once_a_second_and_still_answers(lab, switch):
    # 48 idle sessions waking every 0.1 s (ncclient's select, paramiko's socket reads) took
    # the manager 26 ms of CPU a second and the GIL from its loop each time
    from ncclient.transport import session as nc

    await switch.Describe(pb.DescribeSwitchRequest(switch_id=SID))
    transport = switch._mgr._session._transport
    assert transport.sock.gettimeout() == IDLE_TICK_S >= 1.0
    assert nc.TICK >= IDLE_TICK_S
    # what arrives is still read when it arrives: the edit's answer ends the batch, and
    # a closed session is noticed and opened again
    reply = await switch.ApplyBatch(batch("idle1", connect=[(4, 1)]), timeout=10)
    assert reply.applied.connects == 1
    switch._drop()
    st = await switch.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
    assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(1, 4)}


async def test_an_open_session_is_used_from_the_event_loop_without_a_pool_thread(lab):
    """Once the session is open, a batch's RPCs go out from the event loop and their
    replies come back to it from the session thread: nothing is handed to the pool (each
    hand-off a thread waiting for the GIL, 48 of them when a full pod's answers arrive)."""
    import concurrent.futures

    class Counting(concurrent.futures.ThreadPoolExecutor):
        calls = 0

        def submit(self, fn, /, *args, **kwargs):
            Counting.calls += 1
            return super().submit(fn, *args, **kwargs)

    pool = Counting(1)
    sw = NetconfSwitch(FABRIC, DEVICE, lab.url(SID), creds(lab), executor=pool)
    try:
        await sw.Describe(pb.DescribeSwitchRequest(switch_id=SID))
        opened = Counting.calls
        assert opened >= 1  # the session was opened on the pool
        reply = await sw.ApplyBatch(batch("loop1", connect=[(4, 1), (5, 0)]), timeout=10)
        assert reply.applied.connects == 2
        st = await sw.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
        assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(1, 4), (0, 5)}
        # another session moves a pair behind its back: the device's rpc-error (delete of a
        # pair that is gone: data-missing) reaches the loop, which reads and plans again
        other = NetconfSwitch(FABRIC, DEVICE, lab.url(SID), creds(lab))
        await other.ApplyBatch(batch("o1", connect=[(6, 1)]), timeout=10)
        await other.close()
        await sw.ApplyBatch(batch("loop2", disconnect=[(4, 1)], connect=[(7, 2)]), timeout=10)
        assert (sw.stats.planned_unread, sw.stats.replans) == (2, 1)
        st = await sw.GetCrossConnects(pb.GetCrossConnectsRequest(switch_id=SID))
        assert {(x.port_a, x.port_b) for x in st.cross_connects} == {(0, 5), (1, 6), (2, 7)}
        assert Counting.calls == opened
    finally:
        await sw.close()
        pool.shutdown()
