"""The NETCONF driver (ncclient) against a real NETCONF server process over SSH serving the
Polatis optical-switch model (issue 34)."""

from __future__ import annotations

import grpc
import pytest

from lightpath.client import error_report
from lightpath.domain.southbound import devices
from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath_services.ocs_manager.netconf_driver import NetconfCredentials, NetconfSwitch
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
